"""queue-scorer: GIE's queuedepth/queue_test.go cases."""

import pytest

from scheduler import ScorerCategory
from scheduler.plugins.scorers.queue import QueueScorer
from tests.scheduler.helpers import endpoint, fresh_state, request


@pytest.mark.parametrize(
    ("queues", "expected"),
    [
        pytest.param([10, 5, 0], [0.0, 0.5, 1.0], id="different queue sizes"),
        pytest.param([5, 5], [1.0, 1.0], id="same queue sizes"),
        pytest.param([0, 0], [1.0, 1.0], id="zero queue sizes"),
    ],
)
def test_queue_scorer(queues, expected):
    eps = [endpoint(f"pod{i}", waiting_queue_size=q) for i, q in enumerate(queues)]
    scores = QueueScorer().score(fresh_state(), request(), eps)
    assert [scores[ep] for ep in eps] == pytest.approx(expected, abs=1e-4)


def test_queue_scorer_no_endpoints_and_category():
    assert QueueScorer().score(fresh_state(), request(), []) == {}
    assert QueueScorer.category is ScorerCategory.DISTRIBUTION
