"""The precise policy in the cluster simulation: the simulated pods' KV events reach its index in
virtual time, a prompt returns to the pod whose cache holds it, and the router checks its
predicted cached tokens against what the pods served from their caches."""

from __future__ import annotations

from bench.policies import make_policy
from ray_epp.simulator import DEFAULT_MODEL, ClusterSim, SimRequest, make_pod_configs

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


def test_direct_clients_bypass_the_router_but_their_blocks_reach_its_precise_index():
    """A pool shared with clients of the pods' Service: the router under test is never told of a
    direct request (no route, no completion), yet the pod's KV events carry its blocks, so the
    precise index finds the prefix on the pod the Service chose, and the approximate one does not
    know of it (whatever pod its tie-break picks, it predicts no cached tokens there)."""
    from bench.policies.service_bypass import ServiceBypass
    from bench.workloads.shared_pool import DIRECT, TRAFFIC_HEADER

    reqs = requests(2)
    reqs[0].headers[TRAFFIC_HEADER] = DIRECT
    reqs[1].arrival_time = 1.0  # the direct request is done by then
    for policy, finds in (("epp-precise", True), ("epp-default", False)):
        router = make_policy(policy)
        bypass = ServiceBypass(router, seed=0)
        assert hasattr(bypass, "on_kv_events") == finds
        report = ClusterSim(make_pod_configs(4), bypass, seed=0).run(reqs)
        direct_pod = next(r.pod for r in report.results if r.request_id == "r0")
        assert bypass.direct == {"r0"} and router.predictions["total"] == 1  # only its own request
        routed = next(r for r in report.results if r.request_id == "r1")
        assert router.predictions["right_cached"] == finds  # its predicted cached tokens were right
        if finds:
            assert routed.pod == direct_pod and routed.cached_tokens > 0
        # the default's affinity filter reads the precise match too: only the events' holder stays
        decisions = router.scheduler.plugins["prefix-cache-affinity-filter"].decisions
        assert decisions["sticky" if finds else "no_match"] == 1


def test_shared_pool_workload_marks_a_third_direct_and_is_the_drift_workload_otherwise():
    from bench.workloads.drift import drift_workload
    from bench.workloads.shared_pool import is_direct, shared_pool_workload

    shared, drift = shared_pool_workload(40.0, 0, 600), drift_workload(40.0, 0, 600)
    assert [r.body for r in shared] == [r.body for r in drift]
    assert 0.28 < sum(map(is_direct, shared)) / len(shared) < 0.39
    assert [is_direct(r) for r in shared] == [is_direct(r) for r in shared_pool_workload(40.0, 0, 600)]
