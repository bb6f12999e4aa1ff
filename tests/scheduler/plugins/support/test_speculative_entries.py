"""SpeculativeEntries: a routed prompt's predicted blocks live for the TTL, a newer prediction of
the same key keeps it, the total is bounded, and a pod that left takes its predictions along."""

from __future__ import annotations

import pytest

from scheduler.plugins.support.prefix.speculative_entries import SpeculativeEntries


def test_a_prediction_lives_for_its_ttl():
    s = SpeculativeEntries(ttl_s=2.0)
    s.add("a", [1, 2, 3], now=10.0)
    assert s.match([1, 2, 3, 4]) == {"a": 3}
    s.expire(11.9)
    assert s.match([1, 2]) == {"a": 2}
    s.expire(12.0)
    assert s.match([1, 2]) == {} and len(s) == 0 and s.expired == 1


def test_a_newer_prediction_of_a_key_keeps_it_past_the_older_ttl():
    s = SpeculativeEntries(ttl_s=2.0)
    s.add("a", [1, 2, 3], now=10.0)
    s.add("a", [1, 2], now=11.0)  # a second prompt on the same prefix, shorter
    s.add("b", [1], now=11.0)
    s.expire(12.5)
    assert s.match([1, 2, 3]) == {"a": 2, "b": 1}
    s.expire(13.0)
    assert s.match([1, 2, 3]) == {} and len(s) == 0


def test_the_match_is_the_leading_run_per_pod():
    s = SpeculativeEntries(ttl_s=1.0)
    s.add("a", [1, 2, 3, 4], now=0.0)
    s.add("b", [1, 2, 9], now=0.0)
    assert s.match([1, 2, 3, 4]) == {"a": 4, "b": 2}
    assert s.match([7, 1, 2]) == {}


def test_past_max_entries_the_oldest_predictions_end_early():
    s = SpeculativeEntries(ttl_s=60.0, max_entries=5)
    s.add("a", [1, 2, 3], now=0.0)
    s.add("b", [4, 5, 6], now=1.0)  # 6 entries: the oldest prediction goes
    assert len(s) == 3 and s.match([1]) == {} and s.match([4, 5, 6]) == {"b": 3}
    s.add("b", [4, 5], now=2.0)  # refreshes two keys: nothing more to drop
    s.add("c", [7, 8], now=3.0)  # 5 entries: within the bound
    assert len(s) == 5
    s.add("c", [9], now=4.0)  # 6: b's first prediction ends early, its refreshed keys stay
    assert s.match([4, 5, 6]) == {"b": 2} and len(s) == 5


def test_a_pod_that_left_takes_its_predictions_along():
    s = SpeculativeEntries(ttl_s=5.0)
    s.add("a", [1, 2], now=0.0)
    s.add("b", [1], now=0.0)
    s.remove_pod("a")
    assert s.match([1, 2]) == {"b": 1} and len(s) == 1
    s.expire(10.0)  # a's record ends quietly
    assert len(s) == 0


@pytest.mark.parametrize(("ttl", "cap"), [(0.0, 1), (-1.0, 1), (1.0, 0)])
def test_nonsense_bounds_are_refused(ttl, cap):
    with pytest.raises(ValueError):
        SpeculativeEntries(ttl_s=ttl, max_entries=cap)
