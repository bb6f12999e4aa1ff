"""session-affinity-scorer: llm-d's sessionaffinity/session_affinity_test.go cases, and the token
the gateway sets on responses."""

import base64

import pytest

from scheduler import ScorerCategory
from scheduler.plugins.scorers.session_affinity import (
    SESSION_TOKEN_HEADER,
    SessionAffinityScorer,
    session_token_for,
)
from tests.scheduler.helpers import endpoint, fresh_state, request

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
