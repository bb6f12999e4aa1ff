"""kv-cache-utilization-scorer: GIE's kvcacheutilization/kvcache_utilization_test.go cases."""

import pytest

from scheduler import ScorerCategory
from scheduler.plugins.scorers.kv_cache_utilization import KVCacheUtilizationScorer
from scheduler.registry import plugin_class
from tests.scheduler.helpers import endpoint, fresh_state, request


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        pytest.param([0.8, 0.5, 0.0], [0.2, 0.5, 1.0], id="different KV cache utilization"),
        pytest.param([0.6, 0.6], [0.4, 0.4], id="same KV cache utilization"),
        pytest.param([0.0, 0.0], [1.0, 1.0], id="zero KV cache utilization"),
        pytest.param([1.0, 0.5], [0.0, 0.5], id="full KV cache utilization"),
    ],
)
def test_kv_cache_utilization_scorer(usage, expected):
    eps = [endpoint(f"pod{i}", kv_cache_usage_percent=u) for i, u in enumerate(usage)]
    scores = KVCacheUtilizationScorer().score(fresh_state(), request(), eps)
    assert [scores[ep] for ep in eps] == pytest.approx(expected, abs=1e-4)


def test_registered_by_gie_type_name():
    assert plugin_class("kv-cache-utilization-scorer") is KVCacheUtilizationScorer
    assert KVCacheUtilizationScorer.category is ScorerCategory.DISTRIBUTION
