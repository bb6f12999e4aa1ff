"""running-requests-size-scorer: GIE's runningrequests/running_test.go cases."""

import pytest

from scheduler import ScorerCategory
from scheduler.plugins.scorers.running_requests import RunningRequestsSizeScorer
from scheduler.registry import plugin_class
from tests.scheduler.helpers import endpoint, fresh_state, request


@pytest.mark.parametrize(
    ("running", "expected"),
    [
        pytest.param([10, 5, 0], [0.0, 0.5, 1.0], id="different running queue sizes"),
        pytest.param([5, 5], [1.0, 1.0], id="same running queue sizes"),
        pytest.param([0, 0], [1.0, 1.0], id="zero running queue sizes"),
        pytest.param([3, 7, 11], [1.0, 0.5, 0.0], id="min is not zero"),
    ],
)
def test_running_requests_size_scorer(running, expected):
    # The waiting queue points the other way: the scorer must read running_requests_size only.
    eps = [endpoint(f"pod{i}", running_requests_size=r, waiting_queue_size=100 - r) for i, r in enumerate(running)]
    scores = RunningRequestsSizeScorer().score(fresh_state(), request(), eps)
    assert [scores[ep] for ep in eps] == pytest.approx(expected, abs=1e-4)


def test_registered_by_gie_type_name():
    assert plugin_class("running-requests-size-scorer") is RunningRequestsSizeScorer
    assert RunningRequestsSizeScorer.category is ScorerCategory.DISTRIBUTION
    assert RunningRequestsSizeScorer().score(fresh_state(), request(), []) == {}
