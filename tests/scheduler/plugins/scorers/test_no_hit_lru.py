"""no-hit-lru-scorer: llm-d's cases (llm-d/llm-d-router pkg/epp/framework/plugins/scheduling/
scorer/nohitlru/no_hit_lru_test.go) as a table over real prefix-cache match data, and cold requests
spread over every endpoint in a real scheduler while a warm one stays with its prefix."""

from __future__ import annotations

import pytest

from scheduler import Scheduler
from scheduler.config import load_config
from scheduler.errors import ConfigError
from scheduler.plugins.scorers.no_hit_lru import NoHitLRUScorer
from scheduler.types import ProfileRunResult, SchedulingResult
from tests.scheduler.helpers import as_in_profile, endpoint, request

LONG = "a long shared system prompt that fills several cache blocks. " * 40


def scorer(**params) -> tuple[Scheduler, NoHitLRUScorer]:
    cfg = load_config(
        {
            "plugins": [
                {"type": "approx-prefix-cache-producer"},
                {"type": "prefix-cache-scorer"},
                {"type": "no-hit-lru-scorer", "parameters": params},
            ],
            "schedulingProfiles": [
                {
                    "name": "default",
                    "plugins": [{"pluginRef": "no-hit-lru-scorer"}, {"pluginRef": "prefix-cache-scorer"}],
                }
            ],
        }
    )
    sched = Scheduler.from_config(cfg)
    return sched, sched.plugins["no-hit-lru-scorer"]


EPS = [endpoint("a"), endpoint("b"), endpoint("c")]


def decided(req_id, primary, prefill=None) -> SchedulingResult:
    results = {"decode": ProfileRunResult([endpoint(primary)])}
    if prefill:
        results["prefill"] = ProfileRunResult([endpoint(prefill)])
    return SchedulingResult(results, "decode")


@pytest.mark.parametrize(
    ("history", "want"),
    [
        ([], [1.0, 0.5, 0.0]),  # nothing used yet: candidate order
        (["a"], [0.0, 1.0, 0.5]),  # a took the last cold request: it goes last
        (["a", "b"], [0.5, 0.0, 1.0]),  # never-used c first, then a (older), then b
        (["c", "a", "b"], [0.5, 0.0, 1.0]),  # all used: least recently used first
    ],
)
def test_cold_requests_score_by_lru(history, want):
    sched, s = scorer()
    for i, name in enumerate(history):
        as_in_profile(sched, s, request(prompt=f"cold {i}", request_id=f"h{i}"), EPS)
        s.pre_request(request(request_id=f"h{i}"), decided(f"h{i}", name))
    scores = as_in_profile(sched, s, request(prompt="new", request_id="x"), EPS)
    assert [scores[e] for e in EPS] == pytest.approx(want)


def test_a_lone_candidate_scores_one():
    sched, s = scorer()
    assert list(as_in_profile(sched, s, request(prompt="x"), [endpoint("a")]).values()) == [1.0]


def test_a_warm_request_scores_neutral_and_leaves_the_lru():
    sched, s = scorer()
    eps = [endpoint("a"), endpoint("b"), endpoint("c")]
    first = sched.schedule(request(prompt=LONG, request_id="r1"), eps)  # cold: learns a prefix and the LRU
    lru_before = list(s.lru)
    scores = as_in_profile(sched, s, request(prompt=LONG, request_id="r2"), eps)
    assert set(scores.values()) == {0.5}
    s.pre_request(request(request_id="r2"), first)
    assert list(s.lru) == lru_before


def test_prefill_target_is_used_too_and_lru_size_bounds_it():
    sched, s = scorer(lruSize=2)
    for i, (primary, prefill) in enumerate([("a", "p1"), ("b", None)]):
        as_in_profile(sched, s, request(prompt=f"c{i}", request_id=f"r{i}"), EPS)
        s.pre_request(request(request_id=f"r{i}"), decided(f"r{i}", primary, prefill))
    assert list(s.lru) == ["p1", "b"]  # a was evicted


def test_cold_requests_spread_over_every_endpoint_and_a_warm_one_sticks():
    sched, _ = scorer()
    eps = [endpoint("a"), endpoint("b"), endpoint("c")]
    picks = []
    for i in range(6):
        result = sched.schedule(request(prompt=f"unrelated prompt number {i} " * 30, request_id=f"r{i}"), eps)
        picks.append(result.profile_results["default"].target_endpoints[0].name)
    assert sorted(picks[:3]) == ["a", "b", "c"] and picks[3:] == picks[:3]  # round robin over cold requests
    again = sched.schedule(request(prompt="unrelated prompt number 4 " * 30, request_id="w"), eps)
    assert again.profile_results["default"].target_endpoints[0].name == picks[4]  # warm: prefix wins


@pytest.mark.parametrize(
    ("plugins", "expect"),
    [
        (
            [{"type": "no-hit-lru-scorer"}],
            "reads the data key 'prefix-cache-match-info/approx-prefix-cache-producer', which no plugin",
        ),
        (
            [
                {"type": "queue-scorer"},
                {"type": "no-hit-lru-scorer", "parameters": {"prefixMatchInfoProducerName": "queue-scorer"}},
            ],
            "is a queue-scorer, which produces no prefix-cache match",
        ),
        (
            [{"type": "queue-scorer", "name": "prefix-cache-scorer"}, {"type": "no-hit-lru-scorer"}],
            "is a queue-scorer, not a prefix-cache-scorer",
        ),
    ],
)
def test_config_mistakes(plugins, expect):
    with pytest.raises(ConfigError, match=expect):
        load_config({"plugins": plugins})
