"""Where an actor runs: a pod's metrics actor goes to the pod's Ray node when there is one."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ray.util.scheduling_strategies import In, NodeLabelSchedulingStrategy


@dataclass(slots=True)
class RayNodes:
    """The alive Ray nodes as placement needs them: a node id by IP (the nodes of one machine share
    an IP; then one of them), and every alive node's labels by node id (Ray's own `ray.io/...`
    labels and those given to `ray start --labels`)."""

    by_ip: dict[str, str] = field(default_factory=dict)
    labels: dict[str, dict[str, str]] = field(default_factory=dict)

    @classmethod
    def of(cls, rows: Iterable[Mapping[str, Any]]) -> RayNodes:
        """From `ray.nodes()` rows."""
        alive = [r for r in rows if r.get("Alive")]
        return cls(
            by_ip={r["NodeManagerAddress"]: r["NodeID"] for r in alive},
            labels={r["NodeID"]: dict(r.get("Labels") or {}) for r in alive},
        )


LOOPBACK = ("localhost", "::1", "[::1]")


def is_loopback(address: str) -> bool:
    return address.startswith("127.") or address in LOOPBACK


NODE_ID_LABEL = "ray.io/node-id"  # every Ray node carries its id as this label

# Ray ignores the scheduling strategy of an actor that asks for no resources at all: the GCS
# forwards its lease to a random alive node, which grants it (ray-project/ray
# src/ray/gcs/actor/gcs_actor_scheduler.cc, SelectForwardingNode). An actor placed by a preference
# asks for at least this much CPU (nothing on any real node).
PLACED_MIN_CPUS = 0.001


def placed_cpus(num_cpus: float, strategy: object) -> float:
    """The CPUs to ask for: `num_cpus`, or PLACED_MIN_CPUS when there is a strategy to honour."""
    return max(num_cpus, PLACED_MIN_CPUS) if strategy is not None else num_cpus


def affinity(node_id: str | None) -> NodeLabelSchedulingStrategy | None:
    """Prefer one node (soft): the actor runs there while it is alive, and Ray places (and
    restarts) it elsewhere when it is gone. None: no preference. A soft label preference on the
    node's id label, not NodeAffinitySchedulingStrategy(soft=True): on a Cluster of this machine
    that placed an actor on another alive node now and then (tests/multinode)."""
    return None if node_id is None else prefer_labels({NODE_ID_LABEL: node_id})


def prefer_labels(labels: Mapping[str, str]) -> NodeLabelSchedulingStrategy | None:
    """Prefer nodes with these Ray labels (soft: when none is alive, anywhere). None: no labels."""
    if not labels:
        return None
    return NodeLabelSchedulingStrategy({}, soft={key: In(value) for key, value in labels.items()})
