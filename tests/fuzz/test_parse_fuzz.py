"""parse_request over hostile OpenAI bodies and headers: a ParsedRequest whose body is a JSON
object with a string model (and messages / prompt as the route needs), or a GatewayError with a
4xx status; nothing else escapes, and each body costs bounded time (FUZZ's per-example deadline)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serve_app.gateway.errors import GatewayError
from serve_app.gateway.parsing import PRIORITY_HEADER, ROUTING_HEADERS, parse_request
from serve_app.gateway.settings import GatewaySettings
from tests.fuzz.strategies import FUZZ, MODEL, RAW_BODIES

pytestmark = pytest.mark.timeout(120)

SETTINGS = GatewaySettings(objectives={"chat": 10})
PATHS = st.sampled_from(["/v1/completions", "/v1/chat/completions"])
HEADER_VALUES = st.one_of(st.text(max_size=30), st.sampled_from(["10", "-1001", "1e3", "99999999999999999999", ""]))
HEADERS = st.dictionaries(
    st.sampled_from([PRIORITY_HEADER, "x-gateway-inference-objective", "x-request-id", *sorted(ROUTING_HEADERS),
                     "Content-Length", "X-Gateway-Inference-Priority", "connection"]),
    HEADER_VALUES,
    max_size=3,
)  # fmt: skip


def check(raw: bytes, headers: dict[str, str], path: str, known: set[str] | None) -> None:
    try:
        parsed = parse_request(raw, headers, path, SETTINGS, known)
    except GatewayError as err:
        assert 400 <= err.status < 500, (err.status, err.message)
        assert err.message and err.code
        return
    body = parsed.llm_request.body
    assert isinstance(body, dict) and isinstance(body["model"], str) and body["model"]
    assert known is None or body["model"] in known
    if path.endswith("/chat/completions"):
        assert isinstance(body["messages"], list) and body["messages"]
    else:
        assert "prompt" in body
    assert isinstance(parsed.stream, bool)
    assert not ROUTING_HEADERS & set(parsed.forward_headers), "a client's routing header is never forwarded"
    low, high = SETTINGS.priority_range
    assert low <= parsed.llm_request.priority <= high


@settings(FUZZ, max_examples=200)
@given(RAW_BODIES, HEADERS, PATHS, st.sampled_from([None, {MODEL}]))
def test_parse_request_gives_a_request_or_a_4xx_gateway_error(raw, headers, path, known):
    check(raw, headers, path, known)


DEEP_BODIES = [
    b"[" * 200_000,
    b'{"model": "m", "prompt": 1, "a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    b'{"model": "m", "prompt": "x", "a": ' + b'{"b":' * 900 + b"1" + b"}" * 900 + b"}",
]


@pytest.mark.parametrize("raw", DEEP_BODIES)
def test_deep_bodies_are_a_400(raw):
    with pytest.raises(GatewayError) as err:
        parse_request(raw, {}, "/v1/completions", SETTINGS, None)
    assert err.value.status == 400 and "deeper" in err.value.message
