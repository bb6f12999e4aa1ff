"""Which metrics actor scrapes which pod (actors/metrics_groups.py): plain rules, no Ray."""

from __future__ import annotations

import pytest

from actors.metrics_groups import (
    assigned_node,
    by_name,
    metrics_actor_name,
    metrics_actor_prefix,
    node_group,
    plan_pod_set,
    pod_group,
    pod_node,
    shard_with_room,
    to_place,
)
from actors.options import PodSpec
from actors.placement import RayNodes

NODES = {"10.0.0.1": "node-a", "10.0.0.2": "node-b"}
# Three Ray nodes of one machine: they share 127.0.0.1, only an assignment tells them apart.
A, B, C = ("a" * 56, "b" * 56, "c" * 56)
ONE_MACHINE = RayNodes(
    by_ip={"127.0.0.1": C}, labels={A: {"epp/host": "h0"}, B: {"epp/host": "h1", "gpu": "l4"}, C: {"epp/host": "h1"}}
)


def pod(name: str, address: str = "10.0.0.1", port: int = 8000, node=None, node_labels=None, **labels) -> PodSpec:
    return PodSpec(name=name, address=address, port=port, labels=labels, node=node, node_labels=node_labels or {})


def plan(
    current, wanted: list[PodSpec], remove_missing=True, max_pods=2, local=None, nodes=None, scope="node"
):  # fmt: skip
    nodes = nodes or RayNodes(by_ip=NODES, labels={n: {} for n in NODES.values()})
    return plan_pod_set(
        current,
        by_name(wanted),
        remove_missing=remove_missing,
        nodes=nodes,
        local_node_id=local,
        max_pods=max_pods,
        scope=scope,
    )


def test_names_of_metrics_actors():
    assert metrics_actor_name("ds", "10.0.0.1#2") == "ds:metrics:10.0.0.1#2"
    assert metrics_actor_name("ds", "any").startswith(metrics_actor_prefix("ds"))


def test_a_pods_node_group():
    assert node_group("10.0.0.2", NODES, None) == "10.0.0.2"
    # loopback: the datastore's own node, by its IP; "local" when that node is not known
    assert node_group("127.0.0.1", NODES, "node-b") == "10.0.0.2"
    assert node_group("localhost", NODES, "node-x") == "local"
    assert node_group("::1", {}, None) == "local"
    # on no Ray node
    assert node_group("192.168.7.7", NODES, "node-a") == "any"


def test_the_first_shard_with_room():
    assert shard_with_room("n", {}, 2) == "n"
    assert shard_with_room("n", {"n": 2}, 2) == "n#2"
    assert shard_with_room("n", {"n": 2, "n#2": 2, "n#3": 1}, 2) == "n#3"
    assert shard_with_room("n", {"n": 1, "n#2": 2}, 2) == "n"  # a freed place in the first is taken again


def test_names_must_be_unique():
    with pytest.raises(ValueError, match=r"repeated: \['a'\]"):
        by_name([pod("a"), pod("b"), pod("a", port=9)])


def test_new_pods_fill_their_nodes_group_then_shards():
    change = plan({}, [pod("a"), pod("b"), pod("c"), pod("d", "10.0.0.2"), pod("e", "172.16.0.9")])
    assert change.placed == {"a": "10.0.0.1", "b": "10.0.0.1", "c": "10.0.0.1#2", "d": "10.0.0.2", "e": "any"}
    assert change.added == ["a", "b", "c", "d", "e"] and change.removed == change.replaced == []
    assert change.touched == {"10.0.0.1", "10.0.0.1#2", "10.0.0.2", "any"} and change.changed


def test_an_unchanged_pod_set_changes_nothing():
    current = {"a": (pod("a"), "10.0.0.1"), "b": (pod("b"), "10.0.0.1")}
    assert to_place({n: s for n, (s, _) in current.items()}, by_name([pod("a"), pod("b")])) == []
    change = plan(current, [pod("a"), pod("b")])
    assert not change.changed and change.placed == {} and change.touched == set()


def test_a_changed_spec_is_replaced_and_placed_again():
    current = {"a": (pod("a"), "10.0.0.1"), "b": (pod("b"), "10.0.0.1")}
    # b moves to the other node: it leaves its group, which is touched too
    change = plan(current, [pod("a"), pod("b", "10.0.0.2")])
    assert change.replaced == ["b"] and change.placed == {"b": "10.0.0.2"}
    assert change.touched == {"10.0.0.1", "10.0.0.2"}
    # new labels on a full group: the pod's own place is free again, it stays in the first shard
    change = plan(current, [pod("a"), pod("b", role="decode")])
    assert change.placed == {"b": "10.0.0.1"} and change.touched == {"10.0.0.1"}


def test_removed_pods_still_take_room_while_the_new_ones_are_placed():
    current = {"a": (pod("a"), "10.0.0.1"), "b": (pod("b"), "10.0.0.1")}
    change = plan(current, [pod("c")])
    assert change.removed == ["a", "b"] and change.placed == {"c": "10.0.0.1#2"}
    assert change.touched == {"10.0.0.1", "10.0.0.1#2"}
    # without remove_missing nothing is removed
    change = plan(current, [pod("c")], remove_missing=False)
    assert change.removed == [] and change.added == ["c"]


def test_pods_are_placed_in_the_order_given():
    change = plan({}, [pod("z"), pod("y"), pod("x")], max_pods=1)
    assert list(change.placed.items()) == [("z", "10.0.0.1"), ("y", "10.0.0.1#2"), ("x", "10.0.0.1#3")]


def test_a_pod_assigned_to_a_node_by_id_or_labels():
    assert assigned_node(pod("p", "127.0.0.1", node=B), ONE_MACHINE) == B
    assert assigned_node(pod("p", node_labels={"gpu": "l4"}), ONE_MACHINE) == B
    # several nodes carry the labels: the first by id
    assert assigned_node(pod("p", node_labels={"epp/host": "h1"}), ONE_MACHINE) == B
    # a node that is not alive, labels no node carries, no assignment
    assert assigned_node(pod("p", node="d" * 56), ONE_MACHINE) is None
    assert assigned_node(pod("p", node_labels={"gpu": "h100"}), ONE_MACHINE) is None
    assert assigned_node(pod("p"), ONE_MACHINE) is None


def test_a_pods_node_and_group_fall_back_to_its_address():
    # assigned: that node, whatever the address
    assert pod_node(pod("p", "127.0.0.1", node=A), ONE_MACHINE, C) == A
    assert pod_group(pod("p", "127.0.0.1", node=A), ONE_MACHINE, C) == f"node:{A}"
    # loopback, not assigned: the datastore's node, not whichever node by_ip names for 127.0.0.1
    assert pod_node(pod("p", "127.0.0.1"), ONE_MACHINE, A) == A
    assert pod_node(pod("p", "127.0.0.1", node="d" * 56), ONE_MACHINE, A) == A  # its node is gone
    nodes = RayNodes(by_ip=NODES, labels={})
    assert pod_node(pod("p", "10.0.0.2"), nodes, None) == "node-b"
    assert pod_node(pod("p", "192.168.7.7"), nodes, "node-a") is None
    assert pod_group(pod("p", "192.168.7.7"), nodes, "node-a") == "any"


def test_pods_assigned_to_the_nodes_of_one_machine_get_a_metrics_actor_each():
    wanted = [pod("p0", "127.0.0.1", node=A), pod("p1", "127.0.0.1", node=B), pod("p2", "127.0.0.1", node=A)]
    wanted.append(pod("p3", "127.0.0.1"))
    change = plan({}, wanted, nodes=ONE_MACHINE, local=C)
    assert change.placed == {"p0": f"node:{A}", "p1": f"node:{B}", "p2": f"node:{A}", "p3": "127.0.0.1"}


def test_scope_pod_gives_every_pod_its_own_group():
    change = plan({}, [pod("a"), pod("b"), pod("c", "10.0.0.2")], scope="pod", max_pods=16)
    assert change.placed == {"a": "pod:a", "b": "pod:b", "c": "pod:c"}
    change = plan({"a": (pod("a"), "pod:a")}, [pod("a"), pod("b")], scope="pod")
    assert change.added == ["b"] and change.touched == {"pod:b"}


def test_the_node_field_is_a_ray_node_id():
    with pytest.raises(ValueError, match="node"):
        pod("p", node="worker-1")
