"""max-score-picker: GIE's maxscore/picker_test.go cases, and the random tie-break."""

import random
from collections import Counter

import pytest

from scheduler import ScoredEndpoint
from scheduler.plugins.pickers.max_score import MaxScorePicker, PickerParameters
from tests.scheduler.helpers import endpoint, fresh_state, names

PODS = {n: endpoint(n) for n in ("pod1", "pod2", "pod3")}


def picker(n: int, seed: int = 0) -> MaxScorePicker:
    p = MaxScorePicker(params=PickerParameters(max_num_of_endpoints=n))
    p.rng = random.Random(seed)
    return p


def scored(scores: dict[str, float]) -> list[ScoredEndpoint]:
    return [ScoredEndpoint(PODS[n], s) for n, s in scores.items()]


@pytest.mark.parametrize(
    ("n", "scores", "want", "tie_break_candidates"),
    [
        pytest.param(1, {"pod1": 10, "pod2": 25, "pod3": 15}, ["pod2"], 0, id="single max score"),
        pytest.param(
            2, {"pod1": 50, "pod2": 50, "pod3": 30}, ["pod1", "pod2"], 2, id="multiple max scores, equally scored"
        ),
        pytest.param(
            2, {"pod1": 20, "pod2": 25, "pod3": 30}, ["pod3", "pod2"], 0, id="sorted by score, more pods than needed"
        ),
        pytest.param(
            4,
            {"pod1": 20, "pod2": 25, "pod3": 30},
            ["pod3", "pod2", "pod1"],
            0,
            id="sorted by score, less pods than needed",
        ),
        pytest.param(
            3,
            {"pod1": 30, "pod2": 25, "pod3": 30},
            ["pod1", "pod3", "pod2"],
            2,
            id="sorted by score, num of pods exactly needed",
        ),
    ],
)
@pytest.mark.parametrize("seed", range(5))
def test_pick_max_score(n, scores, want, tie_break_candidates, seed):
    got = names(picker(n, seed).pick(fresh_state(), scored(scores)).target_endpoints)
    k = tie_break_candidates
    # Within the tied head the order is random: compare it as a set, the rest in order.
    assert sorted(got[:k]) == sorted(want[:k])
    assert got[k:] == want[k:]


@pytest.mark.parametrize("n", [1, 2])
def test_ties_are_broken_at_random(n):
    p = picker(n, seed=42)
    cands = scored({"pod1": 5, "pod2": 5, "pod3": 5})
    firsts = Counter(names(p.pick(fresh_state(), cands).target_endpoints)[0] for _ in range(3000))
    assert set(firsts) == {"pod1", "pod2", "pod3"}
    assert all(800 < c < 1200 for c in firsts.values()), firsts


def test_empty_candidates_pick_nothing():
    assert picker(1).pick(fresh_state(), []).target_endpoints == []
    assert picker(3).pick(fresh_state(), []).target_endpoints == []
