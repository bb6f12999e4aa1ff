"""The precise policy in the cluster simulation: the simulated pods' KV events reach its index in
virtual time, a prompt returns to the pod whose cache holds it, and the router checks its
predicted cached tokens against what the pods served from their caches."""

from __future__ import annotations

from bench.policies import make_policy
from simulator import DEFAULT_MODEL, ClusterSim, SimRequest, make_pod_configs

SYSTEM = "a shared system prompt that spans several cache blocks of sixteen tokens each. " * 8


def requests(n: int) -> list[SimRequest]:
    return [
        SimRequest.from_body(
            f"r{i}", 0.05 * i, {"model": DEFAULT_MODEL, "prompt": SYSTEM + f" question {i}?", "max_tokens": 4}
        )
        for i in range(n)
    ]


def test_precise_router_indexes_the_pods_events_and_follows_them():
    router = make_policy("epp-precise")
    report = ClusterSim(make_pod_configs(3), router, seed=0).run(requests(30))
    producer = router.kv_sinks[0]
    assert set(producer.info()["pods"]) <= {"sim-0", "sim-1", "sim-2"}
    assert producer.info()["events"]["stored"] > 0
    assert all(st["status"] == "live" for st in producer.info()["pods"].values())
    assert producer.info()["scored"]["precise"] > 0  # pods never sent a request publish nothing: approximate
    assert report.prefix_hit_rate > 0.5  # the shared prompt was found where the events said
    assert router.predictions["total"] == report.completed
    assert router.predictions["right"] >= 0.8 * router.predictions["total"]


def test_approximate_router_has_no_event_hook():
    router = make_policy("epp-default")
    assert not hasattr(router, "on_kv_events") and router.kv_sinks == []
