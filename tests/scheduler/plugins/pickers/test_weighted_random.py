"""weighted-random-picker: GIE's weightedrandom/picker_test.go cases (selection frequency within
±5% of score / total over 10,000 draws), plus the zero-score rules and small scores."""

import random
from collections import Counter

import pytest

from scheduler import ScoredEndpoint
from scheduler.plugins.pickers.max_score import PickerParameters
from scheduler.plugins.pickers.weighted_random import WeightedRandomPicker
from scheduler.registry import plugin_class
from tests.scheduler.helpers import endpoint, fresh_state, names

ITERATIONS = 10_000
TOLERANCE = 0.05


def picker(n: int = 1, seed: int = 11) -> WeightedRandomPicker:
    p = WeightedRandomPicker(params=PickerParameters(max_num_of_endpoints=n))
    p.rng = random.Random(seed)
    return p


def candidates(scores: list[float]) -> list[ScoredEndpoint]:
    return [ScoredEndpoint(endpoint(f"pod{i + 1}"), s) for i, s in enumerate(scores)]


def frequencies(p, cands, iterations=ITERATIONS) -> dict[str, float]:
    counts = Counter(p.pick(fresh_state(), cands).target_endpoints[0].name for _ in range(iterations))
    return {c.endpoint.name: counts[c.endpoint.name] / iterations for c in cands}


@pytest.mark.parametrize(
    "scores",
    [
        pytest.param([10, 90], id="high weight dominance"),
        pytest.param([100, 100, 100], id="equal weights, uniform"),
        pytest.param([30, 0], id="zero weight exclusion"),
        pytest.param([100, 90, 50, 30, 20], id="multi-tier weights"),
    ],
)
def test_pick_weighted_random(scores):
    cands = candidates(scores)
    total = sum(scores)
    got = frequencies(picker(), cands)
    for c in cands:
        assert abs(got[c.endpoint.name] - c.score / total) <= TOLERANCE, got


def test_zero_score_is_never_picked_while_a_positive_one_remains():
    cands = candidates([30, 0, 0.001])
    got = frequencies(picker(), cands, 3000)
    assert got["pod2"] == 0.0


def test_all_zero_scores_fall_back_to_uniform():
    got = frequencies(picker(), candidates([0, 0, 0, 0]))
    assert all(abs(f - 0.25) <= TOLERANCE for f in got.values()), got


def test_several_picks_are_distinct_and_zero_scores_fill_last():
    p = picker(n=3)
    for _ in range(500):
        got = names(p.pick(fresh_state(), candidates([5, 0, 1, 0])).target_endpoints)
        assert len(got) == 3 and len(set(got)) == 3
        assert set(got[:2]) == {"pod1", "pod3"}  # the two positive scores come before any zero
        assert got[2] in {"pod2", "pod4"}


def test_several_picks_without_replacement_follow_the_weights():
    # Two of three with weights 8, 1, 1: the heavy one is almost always among them (A-Res:
    # P(pod1 in sample) = 1 - P(pod1 last) = 1 - 2 * (1/10 * 1/9) ≈ 0.978).
    p = picker(n=2)
    counts = Counter()
    for _ in range(ITERATIONS):
        counts.update(names(p.pick(fresh_state(), candidates([8, 1, 1])).target_endpoints))
    assert abs(counts["pod1"] / ITERATIONS - (1 - 2 / 90)) <= 0.02, counts
    assert abs(counts["pod2"] / ITERATIONS - counts["pod3"] / ITERATIONS) <= 0.05, counts


def test_tiny_scores_keep_their_proportions():
    # U ** (1 / 1e-300) underflows to 0 for both; the log-key form keeps 1 : 2.
    got = frequencies(picker(), candidates([1e-300, 2e-300]))
    assert abs(got["pod2"] - 2 / 3) <= TOLERANCE, got


def test_registered_by_gie_type_name():
    assert plugin_class("weighted-random-picker") is WeightedRandomPicker
    assert picker().pick(fresh_state(), []).target_endpoints == []
