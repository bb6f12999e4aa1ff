"""The leaf filters of GIE's original filter tree (filter.go at a70d66e5) as plugins: least-queue,
least-kv-cache, low-queue, has-capacity, lora-affinity, critical-request, drop-request. Cases from
GIE's legacy scheduling/filter_test.go (TestFilterFunc, TestLoRASoftAffinityDistribution) plus the
boundaries the Go code implies."""

from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from scheduler import ErrorCode, SchedulingError
from scheduler.cycle_state import FILTER_FAILURE_KEY
from scheduler.plugins.filters.critical_request import CriticalRequestFilter, CriticalRequestParameters
from scheduler.plugins.filters.drop_request import DropRequestFilter
from scheduler.plugins.filters.has_capacity import HasCapacityFilter, HasCapacityParameters
from scheduler.plugins.filters.least_kv_cache import LeastKVCacheFilter
from scheduler.plugins.filters.least_queue import LeastQueueFilter
from scheduler.plugins.filters.lora_affinity import LoraAffinityFilter, LoraAffinityParameters
from scheduler.plugins.filters.low_queue import LowQueueFilter, LowQueueParameters
from scheduler.registry import plugin_class
from tests.scheduler.helpers import endpoint, fresh_state, names, request


def queues(*qs):
    return [endpoint(f"pod{i + 1}", waiting_queue_size=q) for i, q in enumerate(qs)]


def kvs(*kv):
    return [endpoint(f"pod{i + 1}", kv_cache_usage_percent=k) for i, k in enumerate(kv)]


@pytest.mark.parametrize(
    ("type_name", "cls"),
    [
        ("least-queue-filter", LeastQueueFilter),
        ("least-kv-cache-filter", LeastKVCacheFilter),
        ("low-queue-filter", LowQueueFilter),
        ("has-capacity-filter", HasCapacityFilter),
        ("lora-affinity-filter", LoraAffinityFilter),
        ("critical-request-filter", CriticalRequestFilter),
        ("drop-request-filter", DropRequestFilter),
    ],
)
def test_registered_by_type_name(type_name, cls):
    assert plugin_class(type_name) is cls
    assert cls().name == type_name


@pytest.mark.parametrize(
    ("pods", "want"),
    [
        pytest.param([], [], id="least queuing empty input"),
        pytest.param(queues(0, 3, 10), ["pod1", "pod2"], id="least queuing"),  # 0 <= q <= 0 + 10 // 3
        pytest.param(queues(4, 4, 4), ["pod1", "pod2", "pod3"], id="all equal"),
        pytest.param(queues(7), ["pod1"], id="one endpoint"),
        pytest.param(queues(0, 5, 2, 3), ["pod1"], id="four endpoints: 0 <= q <= 5 // 4"),
        pytest.param(queues(0, 5), ["pod1"], id="two endpoints: 0 <= q <= 2"),
        pytest.param(queues(2, 3, 9), ["pod1", "pod2"], id="band starts at the minimum: 2 <= q <= 4"),
        pytest.param(queues(0, 1, 2, 3, 4, 100), ["pod1", "pod2", "pod3", "pod4", "pod5"], id="outlier widens band"),
    ],
)
def test_least_queue(pods, want):
    assert names(LeastQueueFilter().filter(fresh_state(), request(), pods)) == want


@pytest.mark.parametrize(
    ("pods", "want"),
    [
        pytest.param([], [], id="least kv cache empty input"),
        pytest.param(kvs(0.0, 0.3, 1.0), ["pod1", "pod2"], id="least kv cache"),  # kv <= 1/3
        pytest.param(kvs(0.5, 0.5), ["pod1", "pod2"], id="all equal"),
        pytest.param(kvs(0.2, 0.5), ["pod1"], id="two endpoints: kv <= 0.2 + 0.3 / 2"),
        pytest.param(kvs(0.1, 0.4, 0.7, 0.2), ["pod1", "pod4"], id="float division: kv <= 0.1 + 0.6 / 4"),
    ],
)
def test_least_kv_cache(pods, want):
    assert names(LeastKVCacheFilter().filter(fresh_state(), request(), pods)) == want


@pytest.mark.parametrize(
    ("threshold", "pods", "want"),
    [
        pytest.param(128, queues(0, 127, 128, 500), ["pod1", "pod2"], id="default 128: strictly below"),
        pytest.param(5, queues(4, 5, 6), ["pod1"], id="threshold 5"),
        pytest.param(0, queues(0, 1), [], id="threshold 0 keeps none"),
        pytest.param(128, queues(200, 300), [], id="all queuing: empty (the tree's failure)"),
    ],
)
def test_low_queue(threshold, pods, want):
    f = LowQueueFilter(params=LowQueueParameters(threshold=threshold))
    assert names(f.filter(fresh_state(), request(), pods)) == want


def test_low_queue_default_and_bad_parameters():
    assert LowQueueFilter().params.threshold == 128
    with pytest.raises(ValidationError):
        LowQueueParameters.model_validate({"threshold": -1})
    with pytest.raises(ValidationError):
        LowQueueParameters.model_validate({"queueingThreshold": 3})


def capacity(q, kv):
    return HasCapacityFilter(params=HasCapacityParameters(queueThreshold=q, kvCacheThreshold=kv))


@pytest.mark.parametrize(
    ("f", "pods", "want"),
    [
        pytest.param(
            capacity(0, 0.8),
            [
                endpoint("pod1", waiting_queue_size=0, kv_cache_usage_percent=0.0),  # kept
                endpoint("pod2", waiting_queue_size=1, kv_cache_usage_percent=0.3),  # queue too long
                endpoint("pod3", waiting_queue_size=0, kv_cache_usage_percent=1.0),  # KV cache too full
            ],
            ["pod1"],
            id="noQueueAndLessThanKVCacheThresholdPredicate",
        ),
        pytest.param(
            HasCapacityFilter(),
            [
                endpoint("pod1", waiting_queue_size=5, kv_cache_usage_percent=0.8),  # both bounds inclusive
                endpoint("pod2", waiting_queue_size=6, kv_cache_usage_percent=0.1),
                endpoint("pod3", waiting_queue_size=0, kv_cache_usage_percent=0.81),
            ],
            ["pod1"],
            id="defaults 5 and 0.8, inclusive",
        ),
    ],
)
def test_has_capacity(f, pods, want):
    assert names(f.filter(fresh_state(), request(), pods)) == want


def test_has_capacity_defaults():
    p = HasCapacityFilter().params
    assert (p.queue_threshold, p.kv_cache_threshold) == (5, 0.8)


def lora_pod(name, active, max_active, waiting=()):
    return endpoint(name, active_models=list(active), waiting_models=list(waiting), max_active_models=max_active)


def coin(value):
    """An rng whose draws are all `value`: decides the affinity/available choice."""
    return SimpleNamespace(random=lambda: value)


def lora_filter(draw=0.5, threshold=0.999):
    f = LoraAffinityFilter(params=LoraAffinityParameters(threshold=threshold))
    f.rng = coin(draw)
    return f


LORA_CASES = [
    pytest.param(
        [lora_pod("pod1", ["model"], 2), lora_pod("pod2", ["another-model"], 2), lora_pod("pod3", ["foo", "bar"], 2)],
        0.5,
        ["pod1"],
        id="affinity group preferred over the one with room; the full one never",
    ),
    pytest.param(
        [lora_pod("pod1", ["model"], 2), lora_pod("pod2", ["another-model"], 2), lora_pod("pod3", ["foo", "bar"], 2)],
        0.9995,
        ["pod2"],
        id="draw above the threshold: the group with room",
    ),
    pytest.param(
        [lora_pod("pod2", ["another-model"], 2), lora_pod("pod3", ["foo", "bar"], 2), lora_pod("pod4", [], 1)],
        0.0,
        ["pod2", "pod4"],
        id="no affinity: every endpoint with room",
    ),
    pytest.param(
        [lora_pod("pod1", ["model", "x"], 2), lora_pod("pod3", ["foo", "bar"], 2)],
        0.9999,
        ["pod1"],
        id="no room anywhere: the affinity group whatever the draw",
    ),
    pytest.param(
        [lora_pod("pod3", ["foo", "bar"], 2), lora_pod("pod5", [], 0)],
        0.5,
        [],
        id="adapter nowhere and no room: empty (the tree's failure)",
    ),
    pytest.param(
        [lora_pod("pod1", [], 2, waiting=["model"]), lora_pod("pod2", [], 2)],
        0.5,
        ["pod1"],
        id="adapter waiting to load counts as affinity",
    ),
    pytest.param(
        [lora_pod("pod1", ["a"], 2, waiting=["b"]), lora_pod("pod2", ["a"], 2, waiting=["a"])],
        0.5,
        ["pod2"],
        id="running and waiting adapters together fill the slots (union)",
    ),
]


@pytest.mark.parametrize(("pods", "draw", "want"), LORA_CASES)
def test_lora_affinity(pods, draw, want):
    got = lora_filter(draw).filter(fresh_state(), request(model="model"), pods)
    assert names(got) == want


def test_lora_affinity_distribution():
    """TestLoRASoftAffinityDistribution: the affinity group wins with probability `threshold`."""
    pods = [lora_pod("affinity-pod", ["test-affinity-model"], 2), lora_pod("available-pod", [], 2)]
    req = request(model="test-affinity-model")
    for threshold in (0.999, 0.75):
        f = LoraAffinityFilter(params=LoraAffinityParameters(threshold=threshold))
        f.rng.seed(1234)
        iterations = 10_000
        affinity = 0
        for _ in range(iterations):
            got = f.filter(fresh_state(), req, pods)
            assert len(got) == 1
            affinity += got[0].name == "affinity-pod"
        assert abs(affinity / iterations - threshold) < 0.02, (threshold, affinity)


def test_lora_affinity_parameters():
    assert LoraAffinityFilter().params.threshold == 0.999
    assert LoraAffinityParameters.model_validate({"threshold": 0.5}).threshold == 0.5
    for bad in (-0.1, 1.5):
        with pytest.raises(ValidationError):
            LoraAffinityParameters.model_validate({"threshold": bad})


@pytest.mark.parametrize(
    ("min_priority", "priority", "passes"),
    [
        (0, 1, True),  # Critical
        (0, 0, True),  # Standard: not sheddable, so critical by default
        (0, -1, False),  # Sheddable
        (1, 0, False),  # the original tree's strict reading: only Critical
        (1, 1, True),
        (1, 5, True),
    ],
)
def test_critical_request(min_priority, priority, passes):
    f = CriticalRequestFilter(params=CriticalRequestParameters(minPriority=min_priority))
    pods = queues(0, 1)
    got = f.filter(fresh_state(), request(priority=priority), pods)
    assert names(got) == (["pod1", "pod2"] if passes else [])


def test_drop_request_records_resource_exhausted():
    state = fresh_state()
    assert DropRequestFilter().filter(state, request(priority=-1), queues(0, 1)) == []
    err = state.read(FILTER_FAILURE_KEY)
    assert isinstance(err, SchedulingError)
    assert err.code is ErrorCode.RESOURCE_EXHAUSTED
    assert err.http_status == 429
    assert err.message == "dropping request due to limited backend resources"
