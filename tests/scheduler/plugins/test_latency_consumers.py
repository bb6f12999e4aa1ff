"""The predicted-latency consumers (`latency-scorer`, `slo-headroom-tier-filter`,
`latency-slo-admitter`, `prefix-cache-affinity-filter`'s predictor gate) as tables over the key
they read: predictions fed into the cycle state as `predicted-latency-producer` writes them, or
none (a cold predictor)."""

from __future__ import annotations

import pytest

from scheduler import CycleState
from scheduler.cycle_state import FILTER_FAILURE_KEY
from scheduler.errors import ErrorCode
from scheduler.plugins.filters.latency_slo_admitter import LatencySLOAdmitter
from scheduler.plugins.filters.prefix_cache_affinity import PrefixCacheAffinityFilter
from scheduler.plugins.filters.slo_headroom_tier import SLOHeadroomTierFilter
from scheduler.plugins.scorers.latency import LatencyScorer
from scheduler.plugins.support.latency_prediction import PREDICTED_LATENCY, Prediction
from scheduler.plugins.support.prefix import PREFIX_MATCH_INFO, PrefixCacheMatchInfo
from tests.scheduler.helpers import endpoint, names, request

POOL = [endpoint(n, running_requests_size=2, kv_cache_usage_percent=0.3) for n in ("a", "b", "c")]
PREDICTED = {"a": Prediction(20.0, 5.0), "b": Prediction(50.0, 5.0), "c": Prediction(80.0, None)}
OFF = {"x-prediction-based-scheduling": "false"}


def state(predicted: dict[str, Prediction] | None = PREDICTED) -> CycleState:
    s = CycleState()
    if predicted is not None:
        s.put(PREDICTED_LATENCY, predicted)
    return s


@pytest.mark.parametrize(
    ("predicted", "headers", "strategy", "expected"),
    [
        (None, {}, "least", {"a": 1.0, "b": 1.0, "c": 1.0}),  # cold: neutral
        (PREDICTED, {}, "least", {"a": 1.0, "b": 0.5, "c": 0.0}),  # no SLO: lowest TTFT
        (PREDICTED, OFF, "least", {"a": 1.0, "b": 1.0, "c": 1.0}),  # opted out: neutral
        # SLO 60 ms: a and b meet it (the tightest first with `least`), c misses
        (PREDICTED, {"x-slo-ttft-ms": "60"}, "least", {"a": 0.5, "b": 1.0, "c": 0.49}),
        (PREDICTED, {"x-slo-ttft-ms": "60"}, "most", {"a": 1.0, "b": 0.5, "c": 0.49}),
        # a TPOT target only c's missing TPOT prediction can not judge: c is left out
        (PREDICTED, {"x-slo-tpot-ms": "10"}, "least", {"a": 1.0, "b": 1.0}),
    ],
)
def test_latency_scorer(predicted, headers, strategy, expected):
    scorer = LatencyScorer(params=LatencyScorer.Parameters(headroomSelectionStrategy=strategy))
    scores = scorer.score(state(predicted), request(headers=headers), POOL)
    assert {ep.name: round(s, 6) for ep, s in scores.items()} == expected


@pytest.mark.parametrize(
    ("predicted", "headers", "expected"),
    [
        (None, {"x-slo-ttft-ms": "60"}, ["a", "b", "c"]),  # cold
        (PREDICTED, {}, ["a", "b", "c"]),  # no SLO
        (PREDICTED, {"x-slo-ttft-ms": "60", **OFF}, ["a", "b", "c"]),
        (PREDICTED, {"x-slo-ttft-ms": "60"}, ["a", "b"]),  # the tier predicted to meet it
        (PREDICTED, {"x-slo-ttft-ms": "10"}, ["a", "b", "c"]),  # nobody meets it: all stay
    ],
)
def test_slo_headroom_tier_filter(predicted, headers, expected):
    assert names(SLOHeadroomTierFilter().filter(state(predicted), request(headers=headers), POOL)) == expected


@pytest.mark.parametrize(
    ("predicted", "headers", "priority", "admitted"),
    [
        (None, {"x-slo-ttft-ms": "10"}, -1, True),  # cold: never refuses
        (PREDICTED, {"x-slo-ttft-ms": "10"}, -1, False),  # nobody meets it
        (PREDICTED, {"x-slo-ttft-ms": "10"}, 0, True),  # onlySheddable
        (PREDICTED, {"x-slo-ttft-ms": "10", **OFF}, -1, True),
        (PREDICTED, {"x-slo-ttft-ms": "30"}, -1, True),  # a meets it
    ],
)
def test_latency_slo_admitter(predicted, headers, priority, admitted):
    admitter, s = LatencySLOAdmitter(), state(predicted)
    kept = admitter.filter(s, request(headers=headers, priority=priority), POOL)
    assert (kept == POOL) is admitted and (kept == []) is not admitted
    if not admitted:
        err = s.read(FILTER_FAILURE_KEY)
        assert err.code is ErrorCode.RESOURCE_EXHAUSTED and "best, a, is predicted at TTFT 20 ms" in err.message


@pytest.mark.parametrize(
    ("ttft", "expected", "outcome"),
    [
        (None, ["a", "b", "c"], "missing_signal"),  # cold
        ({"a": 60.0, "b": 20.0, "c": 30.0}, ["a"], "sticky"),  # the holder within 50 ms of the best
        ({"a": 100.0, "b": 20.0, "c": 30.0}, ["a", "b", "c"], "load_override"),  # past it: all stay
    ],
)
def test_prefix_cache_affinity_gate_on_predicted_ttft(ttft, expected, outcome):
    params = PrefixCacheAffinityFilter.Parameters(ttftSource="latencyPredictor", maxTTFTPenaltyMs=50)
    f = PrefixCacheAffinityFilter(params=params)
    s = state(None if ttft is None else {name: Prediction(ms, None) for name, ms in ttft.items()})
    s.put(PREFIX_MATCH_INFO, {"a": PrefixCacheMatchInfo(10, 10, 16), "b": PrefixCacheMatchInfo(0, 10, 16)})
    assert names(f.filter(s, request(), POOL)) == expected
    assert [k for k, n in f.decisions.items() if n] == [outcome]
