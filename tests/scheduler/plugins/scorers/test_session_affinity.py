"""session-affinity-scorer: llm-d's sessionaffinity/session_affinity_test.go cases, the token the
gateway sets on responses, and the session_id_header algorithm's bindings."""

import base64

import pytest

from scheduler import ConfigError, ProfileRunResult, SchedulingResult, ScorerCategory, load_config
from scheduler.plugins.scorers.session_affinity import SessionAffinityScorer
from scheduler.plugins.support.session import (
    SESSION_TOKEN_HEADER,
    SessionAffinityParameters,
    SessionBindings,
    session_token_for,
)
from tests.scheduler.helpers import FakeClock, endpoint, fresh_state, request

POD_B_TOKEN = base64.b64encode(b"pod-b").decode()


@pytest.mark.parametrize(
    ("headers", "names", "expected"),
    [
        pytest.param(
            {"x-session-token": POD_B_TOKEN}, ["pod-a", "pod-b"], {"pod-a": 0.0, "pod-b": 1.0}, id="selects pod-b"
        ),
        pytest.param({}, ["pod-a", "pod-b"], {"pod-a": 0.0, "pod-b": 0.0}, id="no session token"),
        pytest.param(
            {"x-session-token": "garbage-token"}, ["pod-a", "pod-b"], {"pod-a": 0.0, "pod-b": 0.0}, id="invalid token"
        ),
        pytest.param({}, [], {}, id="no endpoints available"),
        # Go's base64.StdEncoding is strict: no characters outside the alphabet, padding required.
        pytest.param({"x-session-token": "cG9k-LWI="}, ["pod-b"], {"pod-b": 0.0}, id="token with a stray character"),
        pytest.param({"x-session-token": "cG9kLWI"}, ["pod-b"], {"pod-b": 0.0}, id="token without padding"),
        pytest.param(
            {"X-Session-Token": POD_B_TOKEN}, ["pod-a", "pod-b"], {"pod-a": 0.0, "pod-b": 1.0}, id="header case"
        ),
        pytest.param(
            {"x-session-token": base64.b64encode(b"pod-z").decode()},
            ["pod-a", "pod-b"],
            {"pod-a": 0.0, "pod-b": 0.0},
            id="token for an endpoint not among the candidates",
        ),
        pytest.param(
            {"x-session-token": base64.b64encode(b"\xff\xfe").decode()},
            ["pod-a"],
            {"pod-a": 0.0},
            id="token that is not utf-8",
        ),
    ],
)
def test_session_affinity_score(headers, names, expected):
    eps = [endpoint(n) for n in names]
    scores = SessionAffinityScorer().score(fresh_state(), request(headers=headers), eps)
    assert {ep.name: s for ep, s in scores.items()} == expected


def test_session_token_round_trip():
    assert SESSION_TOKEN_HEADER == "x-session-token"
    assert session_token_for("pod-b") == POD_B_TOKEN == "cG9kLWI="
    eps = [endpoint("10.0.0.5:8000"), endpoint("default/pod-1")]
    for ep in eps:
        req = request(headers={SESSION_TOKEN_HEADER: session_token_for(ep.name)})
        scores = SessionAffinityScorer().score(fresh_state(), req, eps)
        assert [e.name for e, s in scores.items() if s == 1.0] == [ep.name]
    assert SessionAffinityScorer.category is ScorerCategory.AFFINITY


def result_for(**targets: str) -> SchedulingResult:
    """A decision with one target per profile; the first profile is primary."""
    runs = {name: ProfileRunResult([endpoint(ep)]) for name, ep in targets.items()}
    return SchedulingResult(runs, primary_profile_name=next(iter(targets)))


def scorer(**params) -> SessionAffinityScorer:
    return SessionAffinityScorer(params=SessionAffinityParameters.model_validate(params))


def preferred(plugin, req, names_) -> list[str]:
    return [e.name for e, s in plugin.score(fresh_state(), req, [endpoint(n) for n in names_]).items() if s == 1.0]


@pytest.mark.parametrize(
    ("params", "targets", "expected"),
    [
        pytest.param({}, {"default": "pod-b"}, {"x-session-token": POD_B_TOKEN}, id="primary target"),
        pytest.param(
            {"headerName": "X-My-Session", "profileName": "prefill"},
            {"decode": "pod-a", "prefill": "pod-b"},
            {"x-my-session": POD_B_TOKEN},
            id="named profile, own header",
        ),
        pytest.param({"profileName": "prefill"}, {"decode": "pod-a"}, {}, id="that profile did not run"),
        pytest.param({"algorithm": "session_id_header"}, {"default": "pod-b"}, {}, id="client owns its session id"),
    ],
)
def test_response_headers(params, targets, expected):
    assert dict(scorer(**params).response_headers(request(), result_for(**targets))) == expected


def test_a_custom_header_is_the_one_read():
    s = scorer(headerName="x-conversation")
    assert preferred(s, request(headers={"x-conversation": POD_B_TOKEN}), ["pod-a", "pod-b"]) == ["pod-b"]
    assert preferred(s, request(headers={"x-session-token": POD_B_TOKEN}), ["pod-a", "pod-b"]) == []


def test_session_id_sessions_spread_then_stick():
    s = scorer(algorithm="session_id_header")
    pods = ["pod-a", "pod-b", "pod-c"]
    placed = []
    for i in range(3):  # three new sessions: each goes where the fewest sessions are bound
        req = request(headers={"x-session-token": f"s{i}"})
        (pod,) = preferred(s, req, pods)
        s.pre_request(req, result_for(default=pod))
        placed.append(pod)
    assert sorted(placed) == pods
    for i, pod in enumerate(placed):  # and each comes back to its own
        assert preferred(s, request(headers={"x-session-token": f"s{i}"}), pods) == [pod]
    assert preferred(s, request(), pods) == []  # no session: no preference


def test_session_id_binding_waits_for_an_absent_endpoint_then_moves():
    s = scorer(algorithm="session_id_header", missThreshold=2)
    req = request(headers={"x-session-token": "s"})
    s.pre_request(req, result_for(default="pod-a"))
    assert preferred(s, req, ["pod-a", "pod-b"]) == ["pod-a"]
    # pod-a is away once: the request goes to pod-b, the pin stays on pod-a
    assert preferred(s, req, ["pod-b"]) == ["pod-b"]
    s.pre_request(req, result_for(default="pod-b"))
    assert preferred(s, req, ["pod-a", "pod-b"]) == ["pod-a"]
    # away twice in a row: the session moves
    for _ in range(2):
        preferred(s, req, ["pod-b"])
        s.pre_request(req, result_for(default="pod-b"))
    assert preferred(s, req, ["pod-a", "pod-b"]) == ["pod-b"]


def test_session_id_binding_follows_a_request_that_other_scorers_sent_elsewhere():
    s = scorer(algorithm="session_id_header")
    req = request(headers={"x-session-token": "s"})
    s.pre_request(req, result_for(default="pod-a"))
    assert preferred(s, req, ["pod-a", "pod-b"]) == ["pod-a"]
    s.pre_request(req, result_for(default="pod-b"))  # pod-a was a candidate, but lost
    assert preferred(s, req, ["pod-a", "pod-b"]) == ["pod-b"]


def test_bindings_unused_past_the_ttl_are_evicted():
    clock = FakeClock()
    b = SessionBindings(ttl_s=600, sweep_s=30, miss_threshold=3, clock=clock)
    b.bind("old", "pod-a")
    clock.now += 500
    b.bind("recent", "pod-b")
    clock.now += 200  # "old" unused for 700 s, "recent" for 200 s
    b.bind("new", "pod-c")
    assert (b.bound("old"), b.bound("recent"), len(b)) == (None, "pod-b", 2)
    # pod-a has no session left: a new one goes there
    assert b.choose("another", [endpoint("pod-a"), endpoint("pod-b"), endpoint("pod-c")], True).name == "pod-a"


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"algorithm": "sticky"}, "algorithm"),
        ({"headerName": "bad header"}, "headerName"),
        ({"missThreshold": 0}, "missThreshold"),
        ({"evictionTtlSeconds": 0}, "evictionTtlSeconds"),
    ],
)
def test_bad_parameters_are_load_errors(params, field):
    cfg = {"plugins": [{"type": "session-affinity-scorer", "parameters": params}, {"type": "max-score-picker"}]}
    with pytest.raises(ConfigError, match=field):
        load_config(cfg)
