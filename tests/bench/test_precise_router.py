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


def test_with_real_tokenizer_pods_the_token_producer_keys_match_the_pods_events():
    """Pods that tokenize for real (chat template, BPE): the precise router's token-producer reads
    the same tokenizer.json, so its predictions match what the pods served; the drift workload is
    chat with prose and hex groups."""
    from bench.precise_routing import drift_scenario, precise_router
    from bench.tokenizer_fixture import fixture_tokenizer

    scenario = drift_scenario()
    router = precise_router(str(fixture_tokenizer()), 0)
    assert not router.sim_tokens  # the token producer tokenizes, not the 4-character rule
    pods = make_pod_configs(3, num_gpu_blocks=2048, tokenizer=str(fixture_tokenizer()))
    reqs = scenario.workload(20.0, 0, 40)
    assert all("messages" in r.body for r in reqs)
    report = ClusterSim(pods, router, seed=0).run(reqs)
    assert report.completed == 40 and report.results[0].prompt_tokens != reqs[0].prompt_tokens
    producer = router.kv_sinks[0]
    assert producer.info()["scored"]["precise"] > 0 and router.scheduler.plugins["token-producer"].failures == 0
    assert router.predictions["right_cached"] == router.predictions["total_cached"] > 0
