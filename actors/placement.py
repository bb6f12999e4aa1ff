"""Where an actor runs: a pod's metrics actor goes to the pod's Ray node when there is one."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy


def node_ids_by_ip(nodes: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Alive Ray nodes by IP address (`ray.nodes()` rows)."""
    return {n["NodeManagerAddress"]: n["NodeID"] for n in nodes if n.get("Alive")}


def affinity_for(address: str, node_ids: Mapping[str, str]) -> NodeAffinitySchedulingStrategy | None:
    """Soft affinity to the node whose IP is the pod's address (the scrape then stays on the host,
    and if that node is gone the actor runs elsewhere); None when the pod is not on a Ray node."""
    node_id = node_ids.get(address)
    if node_id is None:
        return None
    return NodeAffinitySchedulingStrategy(node_id=node_id, soft=True)
