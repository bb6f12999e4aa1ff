"""active-request-scorer: llm-d's activerequest/active_request_test.go cases (the version that
counts requests itself from PreRequest / ResponseBody), driven through our PreRequest and
ResponseComplete hooks with a fake clock."""

import pytest
from pydantic import ValidationError

from scheduler import PreRequest, ProfileRunResult, ResponseComplete, Scheduler, SchedulingResult, ScorerCategory
from scheduler.plugins.scorers.active_request import ActiveRequestParameters, ActiveRequestScorer
from tests.scheduler.helpers import FakeClock, endpoint, fresh_state, request

POD_A, POD_B, POD_C = (
    endpoint("pod-a", waiting_queue_size=2),
    endpoint("pod-b"),
    endpoint("pod-c", waiting_queue_size=15),
)


def scorer(**params) -> ActiveRequestScorer:
    s = ActiveRequestScorer(params=ActiveRequestParameters(**params))
    s.clock = FakeClock()
    return s


def result_for(**profile_targets) -> SchedulingResult:
    results = {p: ProfileRunResult([ep]) for p, ep in profile_targets.items()}
    return SchedulingResult(results, primary_profile_name=next(iter(results)))


def send(s: ActiveRequestScorer, ep, times: int, prefix: str) -> None:
    for i in range(times):
        s.pre_request(request(request_id=f"{prefix}-{i}"), result_for(default=ep))


def score_names(s, eps) -> dict[str, float]:
    return {ep.name: v for ep, v in s.score(fresh_state(), request(), eps).items()}


@pytest.mark.parametrize(
    ("in_flight", "expected"),
    [
        pytest.param({}, {"pod-a": 1.0, "pod-b": 1.0, "pod-c": 1.0}, id="no endpoints in cache"),
        pytest.param(
            {"pod-a": 3, "pod-b": 0, "pod-c": 6},
            {"pod-a": 0.5, "pod-b": 1.0, "pod-c": 0.0},
            id="all endpoints in cache with different request counts",
        ),
        pytest.param(
            {"pod-a": 4, "pod-c": 1}, {"pod-a": 0.0, "pod-b": 1.0, "pod-c": 0.75}, id="some endpoints in cache"
        ),
    ],
)
def test_score(in_flight, expected):
    s = scorer()
    by_name = {ep.name: ep for ep in (POD_A, POD_B, POD_C)}
    for name, count in in_flight.items():
        send(s, by_name[name], count, name)
    assert score_names(s, [POD_A, POD_B, POD_C]) == pytest.approx(expected)


def test_pre_request_counts_first_target_of_every_profile():
    s = scorer()
    s.pre_request(request(request_id="test-request-1"), result_for(**{"test-profile": POD_A}))
    assert s.counts() == {"pod-a": 1}
    s.pre_request(request(request_id="test-request-2"), result_for(**{"test-profile": POD_A, "prefill": POD_B}))
    assert s.counts() == {"pod-a": 2, "pod-b": 1}
    # A failed profile (None) or an empty result counts nothing; only the first target counts.
    failed = SchedulingResult(
        {"decode": ProfileRunResult([POD_C, POD_A]), "prefill": None, "x": ProfileRunResult([])}, "decode"
    )
    s.pre_request(request(request_id="test-request-3"), failed)
    assert s.counts() == {"pod-a": 2, "pod-b": 1, "pod-c": 1}


@pytest.mark.parametrize(("complete", "expected"), [(True, {}), (False, {"pod-a": 1})])
def test_response_complete_releases_the_request(complete, expected):
    s = scorer()
    req = request(request_id="test-request-1")
    s.pre_request(req, result_for(**{"test-profile": POD_A}))
    if complete:
        s.response_complete(req, "pod-a")
    assert s.counts() == expected
    s.response_complete(req, "pod-a")  # a second completion (or an unknown request) changes nothing
    s.response_complete(request(request_id="never-scheduled"), "pod-a")
    assert s.counts() == {}


def test_response_complete_releases_every_profile_target():
    s = scorer()
    req = request(request_id="pd")
    s.pre_request(req, result_for(decode=POD_A, prefill=POD_B))
    send(s, POD_B, 1, "other")
    s.response_complete(req, "pod-a")
    assert s.counts() == {"pod-b": 1}


def test_request_timeout_expires_requests_never_completed():
    s = scorer(requestTimeout="1s")
    s.pre_request(request(request_id="test-request-ttl"), result_for(**{"test-profile": POD_A}))
    assert s.counts() == {"pod-a": 1}
    s.clock.now += 0.5
    send(s, POD_A, 1, "later")
    assert s.counts() == {"pod-a": 2}
    s.clock.now += 0.6  # the first is 1.1 s old, the second 0.6 s
    assert s.counts() == {"pod-a": 1}
    s.clock.now += 1.0
    assert s.counts() == {}
    assert score_names(s, [POD_A]) == {"pod-a": 1.0}


def test_default_timeout_is_two_minutes():
    s = scorer()
    send(s, POD_A, 1, "r")
    s.clock.now += 119
    assert s.counts() == {"pod-a": 1}
    s.clock.now += 2
    assert s.counts() == {}


def test_scheduling_the_same_request_again_counts_it_once():
    s = scorer()
    req = request(request_id="again")
    s.pre_request(req, result_for(default=POD_A))
    s.pre_request(req, result_for(default=POD_B))
    assert s.counts() == {"pod-b": 1}


@pytest.mark.parametrize(
    "params",
    [
        {"requestTimeout": "invalid"},
        {"requestTimeout": "0s"},
        {"requestTimeout": "-1m"},
        {"idleThreshold": -1},
        {"maxBusyScore": 1.5},
        {"maxBusyScore": -0.1},
        {"requestTimeout": 30},
        {"timeout": "1m"},
    ],
)
def test_invalid_parameters_are_rejected(params):
    # llm-d logs and falls back to defaults; a wrong parameter is a load-time error here.
    with pytest.raises(ValidationError):
        ActiveRequestParameters.model_validate(params)


def test_request_timeout_is_a_go_duration():
    assert ActiveRequestParameters.model_validate({"requestTimeout": "1m30s"}).request_timeout == 90.0
    assert ActiveRequestParameters().request_timeout == 120.0


def test_type_name_and_roles():
    s = ActiveRequestScorer()
    assert s.name == s.type_name == "active-request-scorer"
    assert ActiveRequestScorer(name="test-scorer").name == "test-scorer"
    assert isinstance(s, PreRequest) and isinstance(s, ResponseComplete)
    assert s.category is ScorerCategory.DISTRIBUTION


def test_binary_mode_idle_threshold_0_max_busy_score_0():
    s = scorer(requestTimeout="1m", idleThreshold=0, maxBusyScore=0.0)
    pod_a, pod_b = endpoint("pod-a"), endpoint("pod-b")
    assert score_names(s, [pod_a, pod_b]) == {"pod-a": 1.0, "pod-b": 1.0}
    s.pre_request(request(request_id="req-1"), result_for(primary=pod_a))
    assert score_names(s, [pod_a, pod_b]) == {"pod-a": 0.0, "pod-b": 1.0}


def test_hybrid_mode_idle_threshold_1_max_busy_score_half():
    s = scorer(requestTimeout="1m", idleThreshold=1, maxBusyScore=0.5)
    pod_a, pod_b, pod_c, pod_d = (endpoint(n) for n in ("pod-a", "pod-b", "pod-c", "pod-d"))
    send(s, pod_a, 1, "a")
    send(s, pod_b, 2, "b")
    assert score_names(s, [pod_a, pod_b, pod_c]) == {"pod-a": 1.0, "pod-b": 0.0, "pod-c": 1.0}
    send(s, pod_d, 4, "d")  # the maximum is taken over every tracked endpoint, candidates or not
    assert score_names(s, [pod_b]) == pytest.approx({"pod-b": (4 - 2) / 4 * 0.5})


def test_through_the_scheduler_requests_in_flight_steer_the_next_pick():
    sched = Scheduler.from_config(
        """
plugins:
- type: active-request-scorer
"""
    )
    eps = [endpoint("pod-a"), endpoint("pod-b")]
    first = sched.schedule(request(request_id="1"), eps).target.name
    second = sched.schedule(request(request_id="2"), eps).target.name
    assert {first, second} == {"pod-a", "pod-b"}  # the first pick is busy, so the second goes elsewhere
    sched.response_complete(request(request_id="1"), first)
    assert sched.schedule(request(request_id="3"), eps).target.name == first
