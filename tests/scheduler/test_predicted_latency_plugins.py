"""The predicted-latency plugins on the in-process Scheduler, learning through the real hooks
(PreRequest at the decision, first token, completion) with a clock the test moves."""

from __future__ import annotations

import math

import pytest

from scheduler import CycleState, Endpoint, LLMRequest, Metrics, Scheduler, SchedulingError, load_config
from scheduler.errors import ConfigError, ErrorCode
from scheduler.flowcontrol.types import FlowItem
from scheduler.interfaces import PreRequest, ResponseComplete, ResponseFirstToken
from scheduler.plugins.flowcontrol.slo_deadline import SLODeadlineOrderingPolicy
from scheduler.plugins.support.latency_prediction import PREDICTED_LATENCY, Prediction

CONFIG = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: predicted-latency-producer
  parameters: {minSamples: 8}
- type: slo-headroom-tier-filter
- type: latency-slo-admitter
- type: latency-scorer
  parameters: {headroomSelectionStrategy: HEADROOM}
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: latency-slo-admitter
  - pluginRef: slo-headroom-tier-filter
  - pluginRef: latency-scorer
  - pluginRef: max-score-picker
"""


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def ep(name: str, waiting: int, running: int = 2, kv: float = 0.3) -> Endpoint:
    metrics = Metrics(waiting_queue_size=waiting, running_requests_size=running, kv_cache_usage_percent=kv)
    return Endpoint(name=name, address="127.0.0.1", port=8000, metrics=metrics)


def trained(headroom: str = "least") -> tuple[Scheduler, Clock]:
    """A scheduler whose predictor has seen TTFT = 20 + 10 x waiting ms and TPOT = 5 ms, each
    request sent to a pool of one endpoint so the decision is known."""
    sched = Scheduler.from_config(load_config(CONFIG.replace("HEADROOM", headroom)))
    clock = Clock()
    sched.plugins["predicted-latency-producer"].clock = clock
    for i in range(40):
        waiting = i % 6
        target = ep(f"pod-{waiting % 3}", waiting)
        req = LLMRequest(f"t{i}", "m", body={"prompt": "x" * 40, "max_tokens": 11})
        sched.schedule(req, [target])
        clock.now += (20 + 10 * waiting) / 1000
        sched.response_first_token(req, target.name)
        clock.now += 10 * 0.005
        sched.response_complete(req, target.name)
    return sched, clock


POOL = [ep("pod-0", 0), ep("pod-1", 3), ep("pod-2", 5)]  # predicted ~20, ~50, ~70 ms


def produced(producer, req: LLMRequest, pool: list[Endpoint]) -> dict[str, Prediction] | None:
    """What the producer writes for `req` in a profile run (None: nothing, the model is cold)."""
    state = CycleState()
    producer.produce(state, req, pool)
    return state.get(PREDICTED_LATENCY.of(producer.name))


def pick(sched: Scheduler, headers: dict[str, str], priority: int = 0, pool=POOL) -> str:
    req = LLMRequest("r", "m", body={"prompt": "x" * 40, "max_tokens": 11}, headers=headers, priority=priority)
    return sched.schedule(req, pool, run_pre_request=False).target.name


def test_the_producer_learns_ttft_and_tpot_from_the_hooks():
    sched, _ = trained()
    producer = sched.plugins["predicted-latency-producer"]
    assert producer.info()["observed"] == {"ttft": 40, "tpot": 40}
    assert producer.info()["pending"] == 0
    predicted = produced(producer, LLMRequest("q", "m", body={"prompt": "x" * 40}), POOL)
    assert predicted["pod-0"].ttft_ms == pytest.approx(20, abs=2)
    assert predicted["pod-2"].ttft_ms == pytest.approx(70, abs=3)
    assert predicted["pod-1"].tpot_ms == pytest.approx(5, abs=0.5)


@pytest.mark.parametrize(
    ("headroom", "headers", "expected"),
    [
        ("least", {}, "pod-0"),  # no SLO: the lowest predicted TTFT
        ("least", {"x-slo-ttft-ms": "60"}, "pod-1"),  # tightest endpoint still predicted to meet 60 ms
        ("most", {"x-slo-ttft-ms": "60"}, "pod-0"),  # the roomiest one
        ("least", {"x-slo-ttft-ms": "100"}, "pod-2"),
        ("least", {"x-slo-ttft-ms": "10"}, "pod-0"),  # nobody meets it: the least deficit
        ("least", {"x-slo-ttft-ms": "60", "x-slo-tpot-ms": "2"}, "pod-0"),  # TPOT missed everywhere
    ],
)
def test_slo_aware_picking(headroom, headers, expected):
    sched, _ = trained(headroom)
    assert pick(sched, headers) == expected


def test_cold_predictor_steps_aside():
    sched = Scheduler.from_config(load_config(CONFIG.replace("HEADROOM", "least")))
    assert produced(sched.plugins["predicted-latency-producer"], LLMRequest("q", "m"), POOL) is None  # no key
    # Every endpoint scores alike and passes the filters, even with an SLO nobody could meet.
    names = {pick(sched, {"x-slo-ttft-ms": "1"}, priority=-1) for _ in range(30)}
    assert names == {"pod-0", "pod-1", "pod-2"}


def test_prediction_based_scheduling_false_turns_the_plugins_off_for_the_request():
    sched, _ = trained()
    headers = {"x-slo-ttft-ms": "1", "x-prediction-based-scheduling": "false"}
    assert {pick(sched, headers, priority=-1) for _ in range(30)} == {"pod-0", "pod-1", "pod-2"}


def test_the_admitter_refuses_a_sheddable_request_no_endpoint_can_serve_in_time():
    sched, _ = trained()
    with pytest.raises(SchedulingError) as err:
        pick(sched, {"x-slo-ttft-ms": "10"}, priority=-1)
    assert err.value.code == ErrorCode.RESOURCE_EXHAUSTED
    assert "x-slo-ttft-ms=10" in err.value.message and "pod-0" in err.value.message
    assert pick(sched, {"x-slo-ttft-ms": "10"}, priority=0) == "pod-0"  # onlySheddable: others go through
    assert pick(sched, {"x-slo-ttft-ms": "30"}, priority=-1) == "pod-0"  # one endpoint meets it


@pytest.mark.parametrize(
    ("quiet", "admitted"),
    [(ep("pod-3", 0, running=0, kv=0.3), True), (ep("pod-3", 9, running=4, kv=0.01), True), (ep("pod-3", 9), False)],
)
def test_the_admitter_admits_when_an_endpoint_is_idle_or_cold(quiet, admitted):
    sched, _ = trained()
    pool = [*POOL, quiet]
    if admitted:
        assert pick(sched, {"x-slo-ttft-ms": "10"}, priority=-1, pool=pool)
    else:
        with pytest.raises(SchedulingError):
            pick(sched, {"x-slo-ttft-ms": "10"}, priority=-1, pool=pool)


def test_a_malformed_header_fails_the_request_as_a_bad_request():
    sched, _ = trained()
    with pytest.raises(SchedulingError) as err:
        pick(sched, {"x-slo-ttft-ms": "soon"})
    assert err.value.code == ErrorCode.BAD_REQUEST and "x-slo-ttft-ms" in err.value.message


@pytest.mark.parametrize(
    ("payload_headers", "enqueue", "expected"),
    [
        ({"x-slo-ttft-ms": "200"}, 10.0, (10.2, 10.0)),
        ({}, 10.0, (math.inf, 10.0)),
        ({"x-slo-ttft-ms": "nonsense"}, 3.0, (math.inf, 3.0)),
    ],
)
def test_slo_deadline_ordering(payload_headers, enqueue, expected):
    req = LLMRequest("r", "m", headers=payload_headers)
    policy = SLODeadlineOrderingPolicy()
    for payload in (req, (object(), req)):  # the gateway's payload, and the simulation's pair
        item = FlowItem("r", payload=payload, enqueue_time=enqueue)
        assert policy.key(item) == pytest.approx(expected)


def test_tighter_deadlines_dispatch_first():
    policy = SLODeadlineOrderingPolicy()
    items = [
        FlowItem("late-no-slo", payload=LLMRequest("a", "m"), enqueue_time=1.0),
        FlowItem("loose", payload=LLMRequest("b", "m", headers={"x-slo-ttft-ms": "900"}), enqueue_time=1.0),
        FlowItem("tight-later", payload=LLMRequest("c", "m", headers={"x-slo-ttft-ms": "50"}), enqueue_time=1.2),
    ]
    assert [i.request_id for i in sorted(items, key=policy.key)] == ["tight-later", "loose", "late-no-slo"]


def test_shipped_slo_config_loads():
    from pathlib import Path

    from scheduler import load_config_file

    sched = Scheduler.from_config(load_config_file(Path(__file__).parents[2] / "ray_epp" / "configs" / "slo.yaml"))
    assert "predicted-latency-producer" in sched.plugins


def test_the_inlined_hot_path_predicts_what_the_model_does():
    from scheduler.plugins.producers.predicted_latency import _tpot_features, _ttft_features

    sched, _ = trained()
    producer = sched.plugins["predicted-latency-producer"]
    pool = [
        Endpoint(name=f"pod-{i}", address="h", port=1, metrics=Metrics(i, 2 * i, kv_cache_usage_percent=i / 10))
        for i in range(5)
    ]
    req = LLMRequest("q", "m", body={"prompt": "y" * 400})
    predicted = produced(producer, req, pool)
    for ep in pool:
        x = _ttft_features(ep, 100, 0, 0)
        assert predicted[ep.name].ttft_ms == pytest.approx(producer.ttft.predict(ep.name, x))
        assert predicted[ep.name].tpot_ms == pytest.approx(producer.tpot.predict(ep.name, _tpot_features(ep, 0)))


def test_llm_d_s_own_shape_loads_and_routes():
    """llm-d's predicted-latency sample lists the producer in the profile (streamingMode: true)."""
    sched = Scheduler.from_config(load_config(LLMD_SHAPE))
    assert sched.plugins["predicted-latency-producer"].params.streaming_mode is True
    req = LLMRequest("r", "m", body={"prompt": "x"}, headers={"x-slo-ttft-ms": "100"})
    assert sched.schedule(req, POOL).target.name in {"pod-0", "pod-1", "pod-2"}  # cold: every endpoint passes


LLMD_SHAPE = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: predicted-latency-producer
  parameters: {streamingMode: true}
- type: latency-scorer
- type: weighted-random-picker
- type: slo-headroom-tier-filter
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: predicted-latency-producer
  - pluginRef: slo-headroom-tier-filter
  - pluginRef: latency-scorer
  - pluginRef: weighted-random-picker
"""


def test_the_admitter_listed_outside_every_profile_is_a_load_error_not_silence():
    with pytest.raises(ConfigError, match=r"'latency-slo-admitter' .* add it to a profile's plugins"):
        load_config(
            LLMD_SHAPE.replace(
                "- type: slo-headroom-tier-filter\n", "- type: slo-headroom-tier-filter\n- type: latency-slo-admitter\n"
            )
        )


def test_the_producer_alone_hears_the_hooks_once_per_event():
    """Three consumers in the profile: the producer learns each event once, and no consumer hears it."""
    sched, clock = trained()
    producer = sched.plugins["predicted-latency-producer"]
    for role in (PreRequest, ResponseFirstToken, ResponseComplete):
        assert sched.hooks.having(role) == [producer]
    req = LLMRequest("once", "m", body={"prompt": "x" * 40, "max_tokens": 11})
    sched.schedule(req, [POOL[0]])
    clock.now += 0.02
    sched.response_first_token(req, "pod-0")
    clock.now += 0.05
    sched.response_complete(req, "pod-0")
    assert producer.info()["observed"] == {"ttft": 41, "tpot": 41}


PREFIX_FIRST = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: predicted-latency-producer
- type: latency-scorer
- type: prefix-cache-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: predicted-latency-producer
  - pluginRef: latency-scorer
  - pluginRef: prefix-cache-scorer
"""


def test_the_producer_runs_after_the_profile_s_prefix_producer_and_adds_none():
    """It reads the prefix match (the request's uncached tokens), so it runs after the producer of it
    even when listed first; a profile without a prefix scorer runs no prefix producer for it."""
    sched = Scheduler.from_config(load_config(PREFIX_FIRST))
    producers = [p.type_name for p in sched.profiles["default"].producers]
    assert producers == ["gie-prefix-cache-producer", "predicted-latency-producer"]
    alone = Scheduler.from_config(load_config(PREFIX_FIRST.replace("  - pluginRef: prefix-cache-scorer\n", "")))
    assert [p.type_name for p in alone.profiles["default"].producers] == ["predicted-latency-producer"]


@pytest.mark.parametrize(
    ("plugins", "message"),
    [
        ("- type: latency-scorer\n", "reads the data key 'predicted-latency/predicted-latency-producer', which no"),
        (
            "- type: queue-scorer\n- type: latency-scorer\n  parameters: {predictorName: queue-scorer}\n",
            "predictorName 'queue-scorer' is a queue-scorer, which produces no latency predictions",
        ),
        (
            "- type: slo-headroom-tier-filter\n  parameters: {predictorName: mine}\n",
            "predictorName 'mine' names no plugin in 'plugins'",
        ),
    ],
)
def test_a_consumer_without_its_producer_is_a_load_error(plugins, message):
    ref = "latency-scorer" if "latency-scorer" in plugins else "slo-headroom-tier-filter"
    cfg = f"plugins:\n{plugins}schedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: {ref}\n"
    with pytest.raises(ConfigError, match=message):
        load_config(cfg)


def test_a_consumer_reads_the_producer_its_predictor_name_names():
    cfg = (
        "plugins:\n- type: predicted-latency-producer\n  name: mine\n- type: latency-scorer\n"
        "  parameters: {predictorName: mine}\n"
        "schedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: latency-scorer\n"
    )
    sched = Scheduler.from_config(load_config(cfg))
    assert sched.plugins["latency-scorer"].consumes == (PREDICTED_LATENCY.of("mine"),)
    assert sched.profiles["default"].producers == [sched.plugins["mine"]]
