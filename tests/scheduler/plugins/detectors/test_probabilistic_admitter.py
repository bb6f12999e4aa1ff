"""probabilistic-admitter: the shed probability of llm-d's README and admitter_test.go
(llm-d/llm-d-router pkg/epp/framework/plugins/requestcontrol/admitter/probabilisticadmitter) as a
table, and its draws."""

from __future__ import annotations

import pytest

from scheduler.plugins.detectors.probabilistic_admitter import ProbabilisticAdmitter
from tests.scheduler.helpers import endpoint


def admitter(**params) -> ProbabilisticAdmitter:
    return ProbabilisticAdmitter(params=ProbabilisticAdmitter.Parameters.model_validate(params))


@pytest.mark.parametrize(
    ("params", "pods", "want"),
    [
        ({}, [], 0.0),  # no pods: admit
        ({}, [{}], 0.0),
        ({}, [{"waiting_queue_size": 5}], 1.0),  # saturation 1
        ({}, [{"kv_cache_usage_percent": 0.12}], 0.15**5 * 300),  # ~2.3% at 0.15
        ({}, [{"waiting_queue_size": 1}, {"waiting_queue_size": 2}], min(0.3**5 * 300, 1.0)),
        ({}, [{"kv_cache_usage_percent": 0.8 * 0.34}], min(0.34**5 * 300, 1.0)),  # ~all at 0.34
        ({"power": 2, "k": 1}, [{"waiting_queue_size": 2}], 0.4**2),
        (
            {"queueDepthThreshold": 10, "kvCacheUtilThreshold": 0.5},
            [{"waiting_queue_size": 1, "kv_cache_usage_percent": 0.05}],
            0.1**5 * 300,
        ),
    ],
)
def test_reject_probability(params, pods, want):
    eps = [endpoint(f"p{i}", **m) for i, m in enumerate(pods)]
    assert admitter(**params).reject_probability(eps) == pytest.approx(want)


def test_draws_follow_the_probability_and_idle_pools_are_never_shed():
    a = admitter(power=1, k=1)
    a.rng.seed(3)
    eps = [endpoint("p", waiting_queue_size=2)]  # saturation 0.4
    rate = sum(a.is_pool_saturated(eps) for _ in range(5000)) / 5000
    assert rate == pytest.approx(0.4, abs=0.03)
    assert not any(a.is_pool_saturated([endpoint("p")]) for _ in range(100))
    assert a.per_request
