"""llm-d's own sample configs (tests/fixtures/llm-d, copied verbatim from llm-d/llm-d-router
deploy/config) load as written and schedule sensibly: role filters keep their roles, the queue
scorer avoids a long queue, and a prompt seen before goes back to the endpoint that holds it."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler import Endpoint, Scheduler
from scheduler.config import load_config, load_config_file
from scheduler.errors import ConfigError
from scheduler.plugins.producers.approx_prefix import ApproxPrefixCacheProducer
from scheduler.plugins.scorers.prefix_cache import PrefixCacheScorer
from tests.scheduler.helpers import endpoint, request

FIXTURES = Path(__file__).parents[1] / "fixtures" / "llm-d"
SINGLE = ["epp-config.yaml", "epp-estimate-prefix-cache-config.yaml", "sim-epp-config.yaml"]
PD = ["pd-epp-config.yaml", "sim-pd-epp-config.yaml", "pd-topology-epp-config.yaml"]
EPD = ["sim-e-p-d-epp-config.yaml", "sim-e-pd-epp-config.yaml"]
OTHER = [
    "probabilistic-admitter-epp-config.yaml",
    "soft-reflective-ceiling-epp-config.yaml",
    "sim-program-aware-config.yaml",
]
# tests/scheduler/plugins/producers/test_precise_prefix_producer.py and test_token_producer.py
PRECISE = [
    "sim-epp-no-hit-lru.yaml",
    "sim-epp-kvcache-config.yaml",
    "sim-epp-tokenizer-vllm-http-config.yaml",
    "epp-precise-prefix-cache-config.yaml",
]
BURST = ["epp-burst-prefix-cache-config.yaml"]  # tests/scheduler/plugins/producers/test_burst_prefix_producer.py
LONG = "the same long system prompt, repeated so it spans many cache blocks. " * 80


def pool() -> list:
    return [
        endpoint("decode-a", {"llm-d.ai/role": "decode"}),
        endpoint("decode-b", {"llm-d.ai/role": "decode"}),
        endpoint("prefill-a", {"llm-d.ai/role": "prefill"}),
        endpoint("prefill-b", {"llm-d.ai/role": "prefill"}),
        endpoint("encode-a", {"llm-d.ai/role": "encode"}),
    ]


def test_every_fixture_names_its_source():
    files = sorted(FIXTURES.glob("*.yaml"))
    assert len(files) == len(SINGLE + PD + EPD + OTHER + PRECISE + BURST)
    for f in files:
        assert f.read_text().startswith(f"# Source: github.com/llm-d/llm-d-router deploy/config/{f.name} at commit ")


@pytest.mark.parametrize("name", SINGLE)
def test_single_profile_samples_schedule_on_decode_and_follow_the_prefix(name):
    sched = Scheduler.from_config(load_config_file(FIXTURES / name))
    eps = pool()
    first = sched.schedule(request(prompt=LONG, request_id="r1"), eps)
    target = first.profile_results[first.primary_profile_name].target_endpoints[0].name
    assert target.startswith("decode-")
    for i in range(3):
        again = sched.schedule(request(prompt=LONG, request_id=f"r{i + 2}"), eps)
        assert again.profile_results[again.primary_profile_name].target_endpoints[0].name == target


@pytest.mark.parametrize("name", PD)
def test_pd_samples_use_the_split_producer_and_pick_both_roles(name):
    sched = Scheduler.from_config(load_config_file(FIXTURES / name))
    producers = [p for p in sched.plugins.values() if isinstance(p, ApproxPrefixCacheProducer)]
    scorer = next(p for p in sched.plugins.values() if isinstance(p, PrefixCacheScorer))
    assert len(producers) == 1 and scorer.match_key == producers[0].produces[0]
    assert all(producers[0] in p.producers for p in sched.profiles.values())  # each profile runs it
    assert producers[0].max_prefix_tokens == 16384 and producers[0].lru_capacity == 31250
    assert producers[0].block_size_for([]) == 64  # llm-d's floor, also for sim-pd's blockSizeTokens 16
    eps = pool()
    eps[0] = endpoint("decode-a", {"llm-d.ai/role": "decode"}, waiting_queue_size=50)
    result = sched.schedule(request(prompt=LONG, request_id="r1"), eps)
    decode = result.profile_results["decode"].target_endpoints[0].name
    assert decode == "decode-b"  # the queue scorer avoids the long queue
    assert result.profile_results["prefill"].target_endpoints[0].name.startswith("prefill-")
    # Now decode-b holds the prompt: the producer says so and the decider skips prefill.
    again = sched.schedule(request(prompt=LONG, request_id="r2"), eps)
    assert again.profile_results["decode"].target_endpoints[0].name == "decode-b"
    assert "prefill" not in again.profile_results or again.profile_results["prefill"] is None


@pytest.mark.parametrize("name", EPD)
def test_encode_samples_schedule_text_on_decode(name):
    sched = Scheduler.from_config(load_config_file(FIXTURES / name))
    result = sched.schedule(request(prompt="hi there"), pool())
    assert result.profile_results["decode"].target_endpoints[0].name.startswith("decode-")


def test_api_version_v1_is_accepted():
    cfg = load_config(
        {"apiVersion": "llm-d.ai/v1", "kind": "EndpointPickerConfig", "plugins": [{"type": "queue-scorer"}]}
    )
    assert cfg.api_version == "llm-d.ai/v1"


@pytest.mark.parametrize(
    ("scorer_params", "expect"),
    [
        ({"prefixMatchInfoProducerName": "nope"}, "names no plugin"),
        ({"prefixMatchInfoProducerName": "queue-scorer"}, "is a queue-scorer"),
        ({"prefixMatchInfoProducerName": "approx-prefix-cache-producer", "blockSizeTokens": 32}, "set these on"),
        ({"matchLengthWeight": 0.5, "matchLengthScaleTokens": 0}, "matchLengthScaleTokens"),
    ],
)
def test_scorer_producer_mistakes_are_config_errors(scorer_params, expect):
    doc = {
        "plugins": [
            {"type": "approx-prefix-cache-producer"},
            {"type": "queue-scorer"},
            {"type": "prefix-cache-scorer", "parameters": scorer_params},
        ]
    }
    with pytest.raises(ConfigError, match=expect):
        load_config(doc)


@pytest.mark.parametrize(
    ("params", "expect"),
    [
        ({}, (True, 16, 64, 131072, 31250)),
        ({"blockSizeTokens": 128, "autoTune": False, "lruCapacityPerServer": 10}, (False, 128, 128, 131072, 10)),
        ({"blockSize": 96}, (True, 96, 96, 131072, 31250)),
    ],
)
def test_producer_parameters(params, expect):
    p = ApproxPrefixCacheProducer(params=ApproxPrefixCacheProducer.Parameters.model_validate(params))
    assert (
        p.auto_tune,
        p.default_block_size_tokens,
        p.block_size_for([]),
        p.max_prefix_tokens,
        p.lru_capacity,
    ) == expect


def test_producer_without_autotune_needs_a_block_size():
    doc = {
        "plugins": [{"type": "approx-prefix-cache-producer", "parameters": {"autoTune": False, "blockSizeTokens": 0}}]
    }
    with pytest.raises(ConfigError, match="blockSizeTokens must be > 0"):
        load_config(doc)


def test_pd_topology_sample_puts_prefill_on_the_decode_pods_host():
    sched = Scheduler.from_config(load_config_file(FIXTURES / "pd-topology-epp-config.yaml"))
    host = "kubernetes.io/hostname"
    eps = [
        endpoint("decode-a", {"llm-d.ai/role": "decode", host: "h1"}, waiting_queue_size=50),
        endpoint("decode-b", {"llm-d.ai/role": "decode", host: "h2"}),
        # prefill-b is idle and would win on the queue; only prefill-a shares decode-b's host.
        endpoint("prefill-a", {"llm-d.ai/role": "prefill", host: "h2"}, waiting_queue_size=3),
        endpoint("prefill-b", {"llm-d.ai/role": "prefill", host: "h1"}),
    ]
    result = sched.schedule(request(prompt=LONG, request_id="r1"), eps)
    assert result.profile_results["decode"].target_endpoints[0].name == "decode-b"
    assert result.profile_results["prefill"].target_endpoints[0].name == "prefill-a"
    # Without host labels the filter fails open and the queue decides.
    bare = [Endpoint(e.name, labels={"llm-d.ai/role": e.labels["llm-d.ai/role"]}, metrics=e.metrics) for e in eps]
    sched = Scheduler.from_config(load_config_file(FIXTURES / "pd-topology-epp-config.yaml"))
    result = sched.schedule(request(prompt=LONG, request_id="r1"), bare)
    assert result.profile_results["prefill"].target_endpoints[0].name == "prefill-b"


def test_optimized_baseline_spreads_cold_prompts_and_keeps_warm_ones():
    """llm-d's optimized-baseline guide config (tests/fixtures/llm-d/perf): queue, KV cache, prefix
    and no-hit-LRU scorers."""
    path = FIXTURES / "perf" / "optimized-baseline.yaml"
    assert path.read_text().startswith("# Source: github.com/llm-d/llm-d-router test/perf/config/router-configs/")
    sched = Scheduler.from_config(load_config_file(path))
    eps = [endpoint(n) for n in ("a", "b", "c")]
    cold = [f"cold prompt {i} that shares nothing with the others. " * 40 for i in range(3)]
    picks = [sched.schedule(request(prompt=p, request_id=f"c{i}"), eps) for i, p in enumerate(cold)]
    targets = [r.profile_results["default"].target_endpoints[0].name for r in picks]
    assert sorted(targets) == ["a", "b", "c"]  # cold requests go where no cold request went lately
    for i, p in enumerate(cold):
        again = sched.schedule(request(prompt=p, request_id=f"w{i}"), eps)
        assert again.profile_results["default"].target_endpoints[0].name == targets[i]
    busy = [endpoint("a", waiting_queue_size=20), endpoint("b"), endpoint("c")]
    result = sched.schedule(request(prompt=LONG + "fresh", request_id="q"), busy)
    assert result.profile_results["default"].target_endpoints[0].name != "a"


def test_probabilistic_admitter_sample_sheds_sheddable_requests_as_the_pool_fills():
    from scheduler.admission import admission_detectors, pool_saturated
    from scheduler.plugins.detectors.probabilistic_admitter import ProbabilisticAdmitter

    sched = Scheduler.from_config(load_config_file(FIXTURES / "probabilistic-admitter-epp-config.yaml"))
    detectors = admission_detectors(sched.plugins.values(), named=sched.saturation_detector)
    assert [d.type_name for d in detectors] == ["utilization-detector", "probabilistic-admitter"]
    admitter = next(d for d in detectors if isinstance(d, ProbabilisticAdmitter))
    admitter.rng.seed(7)
    idle = [endpoint("a"), endpoint("b")]
    full = [endpoint("a", waiting_queue_size=5), endpoint("b", kv_cache_usage_percent=0.8)]
    half = [endpoint("a", waiting_queue_size=1), endpoint("b", waiting_queue_size=1)]  # saturation 0.2
    shed = {
        name: sum(pool_saturated(detectors, eps) for _ in range(2000))
        for name, eps in [("idle", idle), ("half", half), ("full", full)]
    }
    assert shed["idle"] == 0 and shed["full"] == 2000  # the utilization detector's line is never reached
    assert abs(shed["half"] / 2000 - 0.2**5 * 300) < 0.03  # about 9.6% shed at saturation 0.2
    result = sched.schedule(request(prompt="hi"), idle)  # random-picker schedules as before
    assert result.profile_results["default"].target_endpoints[0].name in {"a", "b"}


def test_soft_reflective_ceiling_sample_throttles_sheddable_dispatch_as_the_pool_fills():
    """The sample's queue: critical requests dispatch while the pool is below saturation, sheddable
    ones on every cycle while under their reflective ceiling (1 - saturation), on one cycle in
    round(s / (1 - s)) past it, and not at all at saturation; what dispatches is scheduled by the
    sample's scorers."""
    from scheduler.admission import admission_detectors
    from scheduler.flowcontrol.controller import build_flow_controller
    from scheduler.flowcontrol.types import FlowItem, Outcome
    from scheduler.plugins.flowcontrol.soft_reflective_ceiling import SoftReflectiveCeilingPolicy

    cfg = load_config_file(FIXTURES / "soft-reflective-ceiling-epp-config.yaml")
    sched = Scheduler.from_config(cfg)
    detectors = admission_detectors(sched.plugins.values(), named=sched.saturation_detector)
    fc = build_flow_controller(cfg, sched.plugins, detectors)
    assert isinstance(fc.usage_limit, SoftReflectiveCeilingPolicy)

    def dispatches(queues: tuple[int, int], cycles: int) -> tuple[int, int]:
        """(critical, sheddable) dispatched over `cycles` pumps, each dispatch scheduled and settled."""
        eps = [endpoint("a", waiting_queue_size=queues[0]), endpoint("b", waiting_queue_size=queues[1])]
        done: list = []
        for i in range(cycles):
            fc.enqueue(FlowItem(f"c{i}", 1, on_outcome=done.append))
            fc.enqueue(FlowItem(f"s{i}", -1, on_outcome=done.append))
        for _ in range(cycles):
            fc.pump(eps)
            for it in [d for d in done if d.outcome is Outcome.DISPATCHED and fc.unsettled]:
                result = sched.schedule(request(prompt="hi", request_id=it.request_id), eps)
                assert result.profile_results["default"].target_endpoints[0].name == "b"  # the shorter queue
                fc.settled(it)
        served = [d.request_id[0] for d in done if d.outcome is Outcome.DISPATCHED]
        for it in list(fc._by_age):  # clear the queue for the next case
            fc.cancel(it)
        return served.count("c"), served.count("s")

    # Utilization saturation = mean(queue / 5): 0.3 is under sheddable's ceiling 0.7; 0.7 is past
    # its ceiling 0.3 (period round(0.7 / 0.3) = 2); 1.0 holds both bands.
    assert dispatches((2, 1), 6) == (6, 6)
    critical, sheddable = dispatches((4, 3), 12)
    # Critical first (two per pump, the window), then six pumps in which an open pool would send 12
    # sheddable requests: the ceiling opens on every second cycle, so about half of them go.
    assert critical == 12 and 4 <= sheddable <= 6
    assert dispatches((5, 5), 6) == (0, 0)


def test_program_aware_sample_dispatches_the_program_with_least_attained_service_first():
    """The sample's queue: with the pool saturated, two programs queue; once it frees, the one whose
    responses cost fewer weighted tokens goes first, while equal programs go oldest head first;
    what dispatches is scheduled by the sample's queue scorer."""
    from scheduler.admission import admission_detectors
    from scheduler.flowcontrol.controller import build_flow_controller
    from scheduler.flowcontrol.types import FAIRNESS_ID_HEADER, FlowItem, Outcome
    from scheduler.plugins.flowcontrol.program_aware import ProgramAwareFairness

    cfg = load_config_file(FIXTURES / "sim-program-aware-config.yaml")
    sched = Scheduler.from_config(cfg)
    detectors = admission_detectors(sched.plugins.values(), named=sched.saturation_detector)
    fc = build_flow_controller(cfg, sched.plugins, detectors)
    policy = sched.plugins["program-aware-fairness"]
    assert isinstance(policy, ProgramAwareFairness)
    full = [endpoint("a", waiting_queue_size=9), endpoint("b", waiting_queue_size=9)]
    free = [endpoint("a", waiting_queue_size=3), endpoint("b", waiting_queue_size=0)]

    def order(enqueue: list[str]) -> list[str]:
        done: list = []
        for i, program in enumerate(enqueue):
            fc.enqueue(FlowItem(f"{program}-{i}", 0, fairness_id=program, on_outcome=done.append))
            fc.pump(full)  # saturated: everything waits
        assert done == []
        while len(done) < len(enqueue):
            fc.pump(free)
            for it in [d for d in done if d.outcome is Outcome.DISPATCHED and fc.unsettled]:
                result = sched.schedule(request(prompt="hi", request_id=it.request_id), free)
                assert result.profile_results["default"].target_endpoints[0].name == "b"  # the shorter queue
                fc.settled(it)
        return [d.request_id.split("-")[0] for d in done]

    assert order(["heavy", "light"] * 3) == ["heavy", "light"] * 3  # no service yet: oldest head first
    policy.response_usage(request(headers={FAIRNESS_ID_HEADER: "heavy"}), 1000, 500)  # 2,000 weighted tokens
    assert policy.service("heavy") > 1900 and policy.service("light") == 0
    assert order(["heavy", "light"] * 3) == ["light"] * 3 + ["heavy"] * 3
