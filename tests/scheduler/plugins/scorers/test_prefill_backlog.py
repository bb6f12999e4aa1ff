"""prefill-backlog-scorer: the ledger of prompt work sent and not yet answered, table-driven, with a
fake clock; then with the prefix-cache scorer in a real profile (the match info it publishes)."""

import pytest

from scheduler import ProfileRunResult, ResponseComplete, ResponseFirstToken, Scheduler, SchedulingResult
from scheduler.plugins.scorers.prefill_backlog import PrefillBacklogScorer
from scheduler.plugins.support.prefill_ledger import PrefillLedgerParameters
from scheduler.plugins.support.prefix.match_info import PREFIX_MATCH_KEY, PrefixCacheMatchInfo
from tests.scheduler.helpers import FakeClock, endpoint, fresh_state, request

A, B, C = endpoint("pod-a"), endpoint("pod-b"), endpoint("pod-c")
PODS = {"pod-a": A, "pod-b": B, "pod-c": C}


def scorer(**params) -> PrefillBacklogScorer:
    s = PrefillBacklogScorer(params=PrefillLedgerParameters(**params))
    s.clock = FakeClock()
    return s


def sent(s: PrefillBacklogScorer, pod: str, chars: int, request_id: str, match: PrefixCacheMatchInfo | None = None):
    """Tell the scorer a request of `chars` prompt characters went to `pod`."""
    target = PODS[pod].with_attributes({PREFIX_MATCH_KEY: match}) if match else PODS[pod]
    req = request(prompt="x" * chars, request_id=request_id)
    s.pre_request(req, SchedulingResult({"default": ProfileRunResult([target])}, primary_profile_name="default"))
    return req


def scores(s, chars: int = 400, matches: dict[str, PrefixCacheMatchInfo] | None = None) -> dict[str, float]:
    state = fresh_state()
    if matches:
        state.set_endpoint_attributes(PREFIX_MATCH_KEY, matches)
    return {ep.name: v for ep, v in s.score(state, request(prompt="y" * chars), [A, B, C]).items()}


@pytest.mark.parametrize(
    ("in_flight", "matches", "expected_scores", "expected_backlog"),
    # The scored request is 4,000 characters (1,000 tokens); the matches are its cached prefix.
    [
        pytest.param([], None, {"pod-a": 1, "pod-b": 1, "pod-c": 1}, {}, id="nothing in flight: all equal"),
        pytest.param(
            [("pod-a", 4000), ("pod-b", 2000)],
            None,
            {"pod-a": 0.0, "pod-b": 0.5, "pod-c": 1.0},
            {"pod-a": 1000, "pod-b": 500},
            id="min-max over backlog in tokens (4 chars a token)",
        ),
        pytest.param(
            [("pod-a", 4000), ("pod-a", 4000)],
            None,
            {"pod-a": 0.0, "pod-b": 1.0, "pod-c": 1.0},
            {"pod-a": 2000},
            id="requests to one pod add up",
        ),
        pytest.param(
            [("pod-a", 800)],
            {"pod-a": PrefixCacheMatchInfo(60, 62, 16)},  # 960 of its tokens cached on pod-a: cost 200 + 40
            {"pod-a": 1.0, "pod-b": 0.0, "pod-c": 0.0},
            {"pod-a": 200},
            id="a cached prefix outweighs a small backlog",
        ),
        pytest.param(
            [("pod-a", 4000)],
            {"pod-a": PrefixCacheMatchInfo(60, 62, 16)},  # cost 1,000 + 40 against 1,000
            {"pod-a": 0.0, "pod-b": 1.0, "pod-c": 1.0},
            {"pod-a": 1000},
            id="a big backlog outweighs a cached prefix",
        ),
    ],
)
def test_scores_and_backlog(in_flight, matches, expected_scores, expected_backlog):
    s = scorer()
    for i, (pod, chars) in enumerate(in_flight):
        sent(s, pod, chars, f"r{i}")
    assert s.backlog() == expected_backlog
    assert scores(s, chars=4000, matches=matches) == pytest.approx(expected_scores)


def test_cached_tokens_are_not_counted_as_backlog():
    s = scorer()
    sent(s, "pod-a", 4000, "r1", match=PrefixCacheMatchInfo(50, 62, 16))  # 800 of 1000 tokens cached
    assert s.backlog() == {"pod-a": 200}


@pytest.mark.parametrize("release", ["response_first_token", "response_complete"])
def test_first_token_or_completion_releases_the_work(release):
    s = scorer()
    req = sent(s, "pod-a", 4000, "r1")
    sent(s, "pod-b", 400, "r2")
    getattr(s, release)(req, "pod-a")
    assert s.backlog() == {"pod-b": 100}
    getattr(s, release)(req, "pod-a")  # twice (first token, then completion) is harmless
    s.response_complete(request(request_id="never-sent"), "pod-c")
    assert s.backlog() == {"pod-b": 100}


def test_a_request_scheduled_again_is_counted_once():
    s = scorer()
    sent(s, "pod-a", 4000, "r1")
    sent(s, "pod-b", 4000, "r1")  # a retry elsewhere
    assert s.backlog() == {"pod-b": 1000}


def test_lost_requests_expire():
    s = scorer(requestTimeout="30s")
    sent(s, "pod-a", 4000, "r1")
    s.clock.now += 20
    sent(s, "pod-b", 4000, "r2")
    s.clock.now += 15
    assert s.backlog() == {"pod-b": 1000}
    s.clock.now += 20
    assert s.backlog() == {}


def test_pd_counts_the_prefill_target():
    s = scorer()
    req = request(prompt="x" * 4000, request_id="r1")
    result = SchedulingResult(
        {"decode": ProfileRunResult([A]), "prefill": ProfileRunResult([B])}, primary_profile_name="decode"
    )
    s.pre_request(req, result)
    assert s.backlog() == {"pod-b": 1000}
    decode_only = SchedulingResult({"decode": ProfileRunResult([C]), "prefill": None}, primary_profile_name="decode")
    s.pre_request(request(prompt="x" * 400, request_id="r2"), decode_only)
    assert s.backlog() == {"pod-b": 1000, "pod-c": 100}


def test_roles_and_parameters():
    s = PrefillBacklogScorer()
    assert isinstance(s, ResponseFirstToken) and isinstance(s, ResponseComplete)
    assert s.params.request_timeout == 120.0
    with pytest.raises(ValueError):
        PrefillLedgerParameters(requestTimeout="0s")


CONFIG = """
plugins:
- type: prefix-cache-scorer
  parameters: {blockSizeTokens: 4}
- type: prefill-backlog-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-scorer
    weight: 1
  - pluginRef: prefill-backlog-scorer
    weight: 3
"""


def test_in_a_scheduler_work_spreads_until_a_first_token_arrives():
    sched = Scheduler.from_config(CONFIG)
    pods = [endpoint("pod-a"), endpoint("pod-b")]
    first = request(prompt="a" * 2000 + "b" * 2000, request_id="r1")
    home = sched.schedule(first, pods).target.name
    # The same 500-token prefix while the first is still prefilling: its 1,000-token backlog
    # outweighs the cached prefix, so the second goes to the empty pod.
    second = request(prompt="a" * 2000 + "more", request_id="r2")
    assert sched.schedule(second, pods).target.name != home
    sched.response_first_token(first, home)
    # The first answered, the second still prefilling elsewhere: back to the first's pod.
    third = request(prompt="a" * 2000 + "again", request_id="r3")
    assert sched.schedule(third, pods).target.name == home
