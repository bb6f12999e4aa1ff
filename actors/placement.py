"""Where an actor runs: a pod's metrics actor goes to the pod's Ray node when there is one."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy


def node_ids_by_ip(nodes: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Alive Ray nodes by IP address (`ray.nodes()` rows)."""
    return {n["NodeManagerAddress"]: n["NodeID"] for n in nodes if n.get("Alive")}


LOOPBACK = ("localhost", "::1", "[::1]")


def is_loopback(address: str) -> bool:
    return address.startswith("127.") or address in LOOPBACK


def affinity_for(
    address: str, node_ids: Mapping[str, str], local_node_id: str | None = None
) -> NodeAffinitySchedulingStrategy | None:
    """Soft affinity to the node whose IP is the pod's address (the scrape then stays on the host,
    and if that node is gone the actor runs elsewhere). A loopback address means "this machine":
    the node of the caller (`local_node_id`, the datastore's). None when the pod is on no Ray node."""
    node_id = node_ids.get(address)
    if node_id is None and is_loopback(address):
        node_id = local_node_id
    if node_id is None:
        return None
    return NodeAffinitySchedulingStrategy(node_id=node_id, soft=True)
