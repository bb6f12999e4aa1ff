"""random-picker: GIE's random/picker_test.go cases (count and uniformity over 10,000 draws)."""

import random
from collections import Counter

import pytest
from pydantic import ValidationError

from scheduler import Scheduler, ScoredEndpoint
from scheduler.plugins.pickers.max_score import PickerParameters
from scheduler.plugins.pickers.random_picker import RandomPicker
from tests.scheduler.helpers import endpoint, fresh_state, names, request

ITERATIONS = 10_000
TOLERANCE = 0.05


def picker(n: int, seed: int) -> RandomPicker:
    p = RandomPicker(params=PickerParameters(max_num_of_endpoints=n))
    p.rng = random.Random(seed)
    return p


@pytest.mark.parametrize(
    ("n", "scores", "num_pods"),
    [
        pytest.param(1, [10, 20, 30], 1, id="single endpoint from multiple candidates"),
        pytest.param(2, [10, 20, 30], 2, id="multiple endpoints, more candidates than needed"),
        pytest.param(5, [10, 20], 2, id="fewer candidates than maxNumOfEndpoints"),
        pytest.param(3, [10, 20, 30], 3, id="exact number of candidates"),
    ],
)
def test_pick_random(n, scores, num_pods):
    cands = [ScoredEndpoint(endpoint(f"pod{i + 1}"), s) for i, s in enumerate(scores)]
    p = picker(n, seed=7)
    assert len(p.pick(fresh_state(), cands).target_endpoints) == num_pods
    counts = Counter()
    for _ in range(ITERATIONS):
        got = names(p.pick(fresh_state(), cands).target_endpoints)
        assert len(got) == len(set(got)) == num_pods  # no endpoint twice
        counts.update(got)
    expected = min(num_pods / len(cands), 1.0)  # uniform, whatever the scores
    for c in cands:
        assert abs(counts[c.endpoint.name] / ITERATIONS - expected) <= TOLERANCE, counts


def test_scores_are_ignored():
    cands = [ScoredEndpoint(endpoint("low"), 0.0), ScoredEndpoint(endpoint("high"), 100.0)]
    p = picker(1, seed=3)
    counts = Counter(p.pick(fresh_state(), cands).target_endpoints[0].name for _ in range(4000))
    assert 0.45 < counts["low"] / 4000 < 0.55


def test_parameters_from_config():
    sched = Scheduler.from_config(
        """
plugins:
- type: random-picker
  parameters: {maxNumOfEndpoints: 2}
"""
    )
    assert sched.profiles["default"].picker.type_name == "random-picker"
    result = sched.schedule(request(), [endpoint("a"), endpoint("b"), endpoint("c")])
    assert len(result.primary.target_endpoints) == 2
    with pytest.raises(ValidationError):
        PickerParameters.model_validate({"maxNumOfEndpoints": 0})
