"""session-affinity-filter: a hard pin when the session names a candidate, everyone otherwise."""

import pytest

from scheduler.plugins.filters.session_affinity import SessionAffinityFilter
from scheduler.plugins.support.session import SessionAffinityParameters, session_token_for
from tests.scheduler.helpers import endpoint, fresh_state, names, request
from tests.scheduler.plugins.scorers.test_session_affinity import result_for

PODS = ["pod-a", "pod-b", "pod-c"]


def pin(**params) -> SessionAffinityFilter:
    return SessionAffinityFilter(params=SessionAffinityParameters.model_validate(params))


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        pytest.param({"x-session-token": session_token_for("pod-b")}, ["pod-b"], id="pinned"),
        pytest.param({}, PODS, id="no session"),
        pytest.param({"x-session-token": session_token_for("pod-gone")}, PODS, id="stale token"),
        pytest.param({"x-session-token": "%%%"}, PODS, id="garbage token"),
    ],
)
def test_filter(headers, expected):
    kept = pin().filter(fresh_state(), request(headers=headers), [endpoint(n) for n in PODS])
    assert names(kept) == expected


def test_session_id_filter_pins_only_bound_sessions():
    f = pin(algorithm="session_id_header")
    req = request(headers={"x-session-token": "s1"})
    eps = [endpoint(n) for n in PODS]
    assert names(f.filter(fresh_state(), req, eps)) == PODS  # unbound: the scorers place it
    f.pre_request(req, result_for(default="pod-c"))
    assert names(f.filter(fresh_state(), req, eps)) == ["pod-c"]
    assert dict(f.response_headers(req, result_for(default="pod-c"))) == {}


def test_filter_writes_the_token_of_its_target():
    assert dict(pin().response_headers(request(), result_for(default="pod-a"))) == {
        "x-session-token": session_token_for("pod-a")
    }
