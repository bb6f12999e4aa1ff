"""utilization-detector: GIE's saturationdetector/utilization/detector_test.go cases (config,
Saturation, Filter) plus the choices made here (update_time 0 = freshness not tracked, the KV
limit capped at 1.0), through load_config where parameters are concerned."""

import json

import pytest

from scheduler import ConfigError, Scheduler, load_config
from scheduler.plugins.detectors.utilization_detector import UtilizationDetector, UtilizationDetectorParameters
from scheduler.registry import plugin_class
from tests.scheduler.helpers import endpoint, fresh_state, names, request

NOW = 1_750_000_000.0


def config(parameters) -> str:
    return json.dumps(
        {
            "apiVersion": "inference.networking.x-k8s.io/v1alpha1",
            "kind": "EndpointPickerConfig",
            "plugins": [{"name": "detector", "type": "utilization-detector", "parameters": parameters}],
        }
    )


def detector(**params) -> UtilizationDetector:
    d = Scheduler.from_config(load_config(config(params))).plugins["detector"]
    d.clock = lambda: NOW
    return d


def pod(name, q, kv, age=0.0, tracked=True):
    """An endpoint scraped `age` seconds before NOW (or never tracked: update_time 0)."""
    return endpoint(name, waiting_queue_size=q, kv_cache_usage_percent=kv, update_time=NOW - age if tracked else 0.0)


def test_type_and_defaults():
    assert plugin_class("utilization-detector") is UtilizationDetector
    p = UtilizationDetector().params
    assert (p.queue_depth_threshold, p.kv_cache_util_threshold, p.metrics_staleness_threshold, p.headroom) == (
        5,
        0.8,
        0.2,
        0.0,
    )


@pytest.mark.parametrize(
    ("params", "error"),
    [
        pytest.param(
            {"queueDepthThreshold": 10, "kvCacheUtilThreshold": 0.9, "metricsStalenessThreshold": "100ms"},
            None,
            id="valid configuration",
        ),
        pytest.param({}, None, id="empty config applies defaults"),
        pytest.param({"headroom": 2.0}, None, id="high headroom is allowed"),
        pytest.param({"queueDepthThreshold": 0}, "queueDepthThreshold", id="invalid queue depth"),
        pytest.param({"kvCacheUtilThreshold": 1.5}, "kvCacheUtilThreshold", id="invalid kv cache high"),
        pytest.param({"kvCacheUtilThreshold": 0.0}, "kvCacheUtilThreshold", id="invalid kv cache low"),
        pytest.param({"metricsStalenessThreshold": "0s"}, "metricsStalenessThreshold", id="zero staleness"),
        pytest.param({"metricsStalenessThreshold": "-1s"}, "metricsStalenessThreshold", id="negative staleness"),
        pytest.param({"metricsStalenessThreshold": "soon"}, "invalid duration", id="not a duration"),
        pytest.param({"metricsStalenessThreshold": 0.2}, "unit", id="a bare number is refused"),
        pytest.param({"headroom": -0.5}, "headroom", id="invalid headroom"),
        pytest.param({"queueDepth": 3}, "unknown parameter", id="unknown field"),
    ],
)
def test_config(params, error):
    if error is None:
        load_config(config(params))
        return
    with pytest.raises(ConfigError) as info:
        load_config(config(params))
    assert "'detector'" in str(info.value) and error in str(info.value)


def test_staleness_duration_is_parsed():
    p = UtilizationDetectorParameters.model_validate({"metricsStalenessThreshold": "1m30s"})
    assert p.metrics_staleness_threshold == 90.0


SATURATION_CASES = [
    pytest.param([], 1.0, id="no candidate pods: fail closed"),
    pytest.param([pod("pod1", 2, 0.5)], 0.5 / 0.9, id="single pod with good capacity"),
    pytest.param([pod("pod1", 1, 0.1, age=0.2)], 1.0, id="single pod with stale metrics"),
    pytest.param([pod("pod1", 10, 0.1)], 2.0, id="single pod with high queue depth"),
    pytest.param([pod("pod1", 1, 0.95)], 0.95 / 0.90, id="single pod with high KV cache utilization"),
    pytest.param([pod("pod1", 1, 0.1), pod("pod2", 0, 0.2)], (0.2 + 0.2 / 0.9) / 2, id="all good capacity"),
    pytest.param([pod("pod1", 1, 0.1), pod("pod2", 0, 0.2, age=0.3)], 0.6, id="one good, one stale"),
    pytest.param([pod("pod1", 1, 0.1), pod("pod2", 15, 0.2)], 1.6, id="one good, one bad (high queue)"),
    pytest.param(
        [pod("pod1", 1, 0.1, age=0.2), pod("pod2", 20, 0.2), pod("pod3", 1, 0.99)],
        (1.0 + 4.0 + 1.1) / 3,
        id="all bad capacity",
    ),
    pytest.param([pod("pod1", 5, 0.1)], 1.0, id="queue depth exactly at threshold"),
    pytest.param([pod("pod1", 1, 0.1, age=0.101)], 1.0, id="metrics age just over staleness threshold"),
    pytest.param([pod("pod1", 1, 0.1, age=0.099)], 0.2, id="metrics age just under staleness threshold"),
    pytest.param([pod("pod1", 1, 0.1, tracked=False)], 0.2, id="update_time 0: freshness not tracked"),
]


@pytest.mark.parametrize(("pods", "want"), SATURATION_CASES)
def test_saturation(pods, want):
    d = detector(queueDepthThreshold=5, kvCacheUtilThreshold=0.9, metricsStalenessThreshold="100ms")
    assert d.saturation(pods) == pytest.approx(want, abs=1e-4)
    assert d.is_pool_saturated(pods) is (want >= 1.0 - 1e-9)


@pytest.mark.parametrize(
    ("pods", "saturated"),
    [
        pytest.param([pod("a", 4, 0.5), pod("b", 4, 0.5)], False, id="every endpoint below both thresholds"),
        pytest.param([pod("a", 5, 0.0), pod("b", 5, 0.0)], True, id="every queue at the threshold"),
        pytest.param([pod("a", 0, 0.8), pod("b", 0, 0.8)], True, id="every KV cache at the threshold"),
        pytest.param([pod("a", 20, 0.1), pod("b", 0, 0.1)], True, id="average: one very busy endpoint saturates"),
        pytest.param([pod("a", 6, 0.1), pod("b", 0, 0.1)], False, id="average: one a little busy does not"),
        pytest.param([pod("a", 0, 0.0, age=1.0)], True, id="stale counts as saturated"),
    ],
)
def test_is_pool_saturated_with_defaults(pods, saturated):
    assert detector().is_pool_saturated(pods) is saturated


FILTER_CASES = [
    pytest.param([pod("pod1", 1, 0.1), pod("pod2", 4, 0.7)], ["pod1", "pod2"], id="all pass - under thresholds"),
    pytest.param([pod("pod1", 5, 0.8)], ["pod1"], id="pass - at threshold but under burst"),
    pytest.param([pod("pod1", 5, 0.9)], ["pod1"], id="pass - in headroom burst"),
    pytest.param([pod("pod1", 7, 0.1), pod("pod2", 1, 0.1)], ["pod2"], id="filtered - exceeds queue burst"),
    pytest.param([pod("pod1", 6, 0.1), pod("pod2", 1, 0.1)], ["pod2"], id="filtered - queue at the burst limit"),
    pytest.param([pod("pod1", 1, 0.97), pod("pod2", 1, 0.5)], ["pod2"], id="filtered - exceeds KV burst"),
    pytest.param([pod("pod1", 1, 0.1, age=0.2), pod("pod2", 1, 0.1)], ["pod2"], id="filtered - stale"),
    pytest.param(
        [pod("pod1", 1, 0.1, age=0.2), pod("pod2", 1, 0.1, age=0.2)],
        ["pod1", "pod2"],
        id="pass - all stale (fail open at pool level)",
    ),
    pytest.param([pod("pod1", 10, 0.1), pod("pod2", 1, 0.99)], ["pod1", "pod2"], id="pass - all saturated (fail open)"),
    pytest.param([pod("pod1", 1, 0.1, tracked=False)], ["pod1"], id="update_time 0 is not stale"),
    pytest.param([], [], id="no endpoints"),
]


@pytest.mark.parametrize(("pods", "want"), FILTER_CASES)
def test_filter_with_headroom(pods, want):
    d = detector(queueDepthThreshold=5, kvCacheUtilThreshold=0.8, metricsStalenessThreshold="100ms", headroom=0.2)
    assert names(d.filter(fresh_state(), request(), pods)) == want


@pytest.mark.parametrize(
    ("pods", "want"),
    [
        pytest.param([pod("a", 4, 0.79), pod("b", 5, 0.1), pod("c", 0, 0.8)], ["a"], id="no headroom: strictly below"),
        pytest.param([pod("a", 0, 0.1, tracked=False), pod("b", 9, 0.1)], ["a"], id="untracked judged on load"),
    ],
)
def test_filter_defaults(pods, want):
    assert names(detector().filter(fresh_state(), request(), pods)) == want


def test_kv_limit_is_capped_at_one():
    """kvCacheUtilThreshold 0.9 * (1 + 0.5) = 1.35 would pass a full KV cache; the cap (GIE's README) stops it."""
    d = detector(kvCacheUtilThreshold=0.9, headroom=0.5)
    pods = [pod("full", 0, 1.0), pod("ok", 0, 0.99)]
    assert names(d.filter(fresh_state(), request(), pods)) == ["ok"]


def test_real_clock_marks_old_scrapes_stale():
    import time

    d = UtilizationDetector()  # the real clock
    fresh = endpoint("fresh", update_time=time.time())
    old = endpoint("old", update_time=time.time() - 5.0)
    assert names(d.filter(fresh_state(), request(), [fresh, old])) == ["fresh"]
