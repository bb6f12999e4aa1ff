"""Which metrics actor scrapes which pod: plain rules, no Ray (the datastore applies them, and
`actors/metrics_fleet.py` makes the actors match).

One `NodeMetricsActor` scrapes the pods of one Ray node (`metrics_actor_scope: node`). A pod's node
is the one its spec assigns (`node`: a node id, or `node_labels`: the first alive node, by id, that
carries them all; group `node:<id>`); else the node whose IP is its address (group: that IP), the
datastore's own node for a loopback address (its IP), and `any` for pods on no Ray node. Several
Ray nodes of one machine share its IP: only an assignment tells them apart. At most
`max_pods_per_metrics_actor` pods a group (more go to `<group>#2`, `#3`, ..., the first with room).
With `metrics_actor_scope: pod` every pod has its own group, `pod:<name>`, on the pod's node. The
actor of group g of datastore d is named `d:metrics:g`, so a restarted datastore finds its actors by
name. A pod keeps its group until its spec changes, also when its node is lost: Ray restarts the
actor elsewhere (its affinity is soft) and it goes on scraping the same pods."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from actors.options import PodSpec
from actors.placement import RayNodes, is_loopback

ANY_NODE = "any"
LOCAL = "local"  # a loopback pod when the datastore's node is not among the known nodes


def metrics_actor_prefix(datastore_name: str) -> str:
    return f"{datastore_name}:metrics:"


def metrics_actor_name(datastore_name: str, group: str) -> str:
    return metrics_actor_prefix(datastore_name) + group


def node_group(address: str, node_ids: Mapping[str, str], local_node_id: str | None) -> str:
    """The group of a pod's node: its address when that is a Ray node's IP (`node_ids`: node id by
    IP), the IP of the local node (`local_node_id`, the datastore's) for a loopback address, or
    `any`."""
    if address in node_ids:
        return address
    if is_loopback(address):
        return next((ip for ip, node_id in node_ids.items() if node_id == local_node_id), LOCAL)
    return ANY_NODE


def assigned_node(spec: PodSpec, nodes: RayNodes) -> str | None:
    """The alive node the spec assigns the pod to (`node`, else the first node by id carrying all
    `node_labels`), or None: not assigned, or no alive node matches."""
    if spec.node is not None:
        return spec.node if spec.node in nodes.labels else None
    if spec.node_labels:
        wanted = spec.node_labels.items()
        return next((n for n in sorted(nodes.labels) if wanted <= nodes.labels[n].items()), None)
    return None


def pod_node(spec: PodSpec, nodes: RayNodes, local_node_id: str | None) -> str | None:
    """The node a pod runs on, where its metrics actor goes: the assigned one, else by its address
    (a node's IP; loopback: `local_node_id`, the datastore's node), else None."""
    node_id = assigned_node(spec, nodes)
    if node_id is None and is_loopback(spec.address):
        return local_node_id  # not by_ip: the nodes of one machine share 127.0.0.1
    return node_id or nodes.by_ip.get(spec.address)


def pod_group(spec: PodSpec, nodes: RayNodes, local_node_id: str | None, scope: str = "node") -> str:
    """The group a pod belongs to before sharding (see the module doc)."""
    if scope == "pod":
        return f"pod:{spec.name}"
    node_id = assigned_node(spec, nodes)
    if node_id is not None:
        return f"node:{node_id}"
    return node_group(spec.address, nodes.by_ip, local_node_id)


def shard_with_room(base: str, sizes: Mapping[str, int], max_pods: int) -> str:
    """The first of `base`, `base#2`, `base#3`, ... that has fewer than `max_pods` pods."""
    shard = 1
    while True:
        group = base if shard == 1 else f"{base}#{shard}"
        if sizes.get(group, 0) < max_pods:
            return group
        shard += 1


def by_name(specs: Sequence[PodSpec]) -> dict[str, PodSpec]:
    """The specs by pod name; a ValueError naming the names used twice."""
    wanted = {s.name: s for s in specs}
    if len(wanted) != len(specs):
        dupes = sorted({s.name for s in specs if sum(t.name == s.name for t in specs) > 1})
        raise ValueError(f"pod names must be unique, repeated: {dupes}")
    return wanted


def to_place(current: Mapping[str, PodSpec], wanted: Mapping[str, PodSpec]) -> list[str]:
    """The wanted pods that need a group: new ones, and those whose spec changed."""
    return [name for name, spec in wanted.items() if current.get(name) != spec]


@dataclass(slots=True)
class PodSetChange:
    """What making the pod set `wanted` changes: names added, removed and replaced (same name, new
    spec), the group of every added or replaced pod (in the order they are placed), and the groups
    whose member list changed."""

    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)
    placed: dict[str, str] = field(default_factory=dict)
    touched: set[str] = field(default_factory=set)

    @property
    def changed(self) -> bool:
        return bool(self.added or self.removed or self.replaced)


def plan_pod_set(
    current: Mapping[str, tuple[PodSpec, str]],
    wanted: Mapping[str, PodSpec],
    *,
    remove_missing: bool,
    nodes: RayNodes,
    local_node_id: str | None,
    max_pods: int,
    scope: str = "node",
) -> PodSetChange:
    """Place the wanted pods that need it (`to_place`) given the current pods' (spec, group), one
    after the other: a replaced pod leaves its group first, and each placed pod counts towards its
    group's size for the next ones. Pods missing from `wanted` are removed only with
    `remove_missing`, after the placing (until then they still take room)."""
    groups = {name: group for name, (_, group) in current.items()}
    change = PodSetChange()
    for name in to_place({n: spec for n, (spec, _) in current.items()}, wanted):
        old = groups.pop(name, None)
        if old is not None:
            change.touched.add(old)
            change.replaced.append(name)
        else:
            change.added.append(name)
        sizes: dict[str, int] = {}
        for group in groups.values():
            sizes[group] = sizes.get(group, 0) + 1
        group = shard_with_room(pod_group(wanted[name], nodes, local_node_id, scope), sizes, max_pods)
        groups[name] = change.placed[name] = group
        change.touched.add(group)
    if remove_missing:
        for name in [n for n in current if n not in wanted]:
            change.touched.add(groups.pop(name))
            change.removed.append(name)
    return change
