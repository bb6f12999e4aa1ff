"""parse_request's limits, without Ray: JSON depth, priority range, and the body the profile
actors get."""

from __future__ import annotations

import json
import pickle

import pytest

from actors.protocol import ProfileCall
from scheduler import CycleState, build_plugins, load_config_file
from serve_app.gateway.errors import GatewayError
from serve_app.gateway.parsing import json_depth_over, parse_request
from serve_app.gateway.settings import GatewaySettings

MODEL = "m"
DEFAULT_FIELDS = build_plugins(load_config_file("default")).body_fields


def parse(raw: bytes, headers: dict | None = None, path: str = "/v1/completions", **settings):
    return parse_request(raw, headers or {}, path, GatewaySettings(**settings), None)


def nested(depth: int, field: str = "prompt") -> bytes:
    return b'{"model": "m", "' + field.encode() + b'": ' + b"[" * depth + b"]" * depth + b"}"


@pytest.mark.parametrize("depth", [64, 700, 990, 100_000])
def test_deep_json_is_a_400_in_openai_shape(depth):
    with pytest.raises(GatewayError) as info:
        parse(nested(depth))
    assert info.value.status == 400 and info.value.code == "BadRequest"
    assert "deeper than the limit of 64" in info.value.message


def test_json_at_the_limit_parses_and_pickles():
    # the object itself is level 1; chat messages, as a prompt is checked to be vLLM's shape
    parsed = parse(nested(63, "messages"), path="/v1/chat/completions")
    pickle.dumps(ProfileCall(parsed.llm_request.with_body_fields(DEFAULT_FIELDS), CycleState()))


def test_depth_check_counts_objects_and_lists_and_ignores_brackets_in_strings():
    body = {"model": "m", "prompt": "[" * 500, "x": [{"a": [{"b": []}]}]}
    raw = json.dumps(body).encode()
    assert not json_depth_over(raw, body, 6)  # object, list, object, list, object, list
    assert json_depth_over(raw, body, 5)


def test_priority_outside_the_range_is_refused():
    raw = json.dumps({"model": "m", "prompt": "x"}).encode()
    assert parse(raw, {"x-gateway-inference-priority": "-1000"}).llm_request.priority == -1000
    with pytest.raises(GatewayError, match=r"must lie in \[-1000, 1000\]"):
        parse(raw, {"x-gateway-inference-priority": "1001"})


def test_profile_actors_get_only_what_scheduling_reads():
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}],
        "cache_salt": "s",
        "tools": [{"type": "function"}] * 100,
        "response_format": {"type": "json_schema"},
        "max_tokens": 5,
    }
    req = parse(json.dumps(body).encode(), path="/v1/chat/completions").llm_request
    req.excluded_endpoints = frozenset({"pod-a"})
    sent = req.with_body_fields(DEFAULT_FIELDS)  # what the default config's plugins declare
    # the prompt for the prefix plugins, the output limit for the in-flight load producer (made for
    # the affinity filter's throughput gate: a request's load counts its output estimate)
    assert sent.body == {k: body[k] for k in ("messages", "cache_salt", "max_tokens")}
    with_load = build_plugins(load_config_file("slo")).body_fields  # its latency plugins read the output limit
    assert req.with_body_fields(with_load).body == {k: body[k] for k in ("messages", "cache_salt", "max_tokens")}
    assert sent.prompt_text() == req.prompt_text() and sent.cache_salt() == "s"
    assert (sent.request_id, sent.priority, sent.excluded_endpoints) == (req.request_id, 0, frozenset({"pod-a"}))
    assert req.body["tools"]  # the gateway keeps the whole body to forward


@pytest.mark.parametrize(
    ("headers", "named"),
    [
        ({"x-slo-ttft-ms": "soon"}, "x-slo-ttft-ms"),
        ({"X-SLO-TPOT-MS": "-1"}, "x-slo-tpot-ms"),
        ({"x-prediction-based-scheduling": "perhaps"}, "x-prediction-based-scheduling"),
    ],
)
def test_a_malformed_slo_header_is_a_400_naming_it(headers, named):
    raw = json.dumps({"model": "m", "prompt": "p"}).encode()
    with pytest.raises(GatewayError) as err:
        parse(raw, headers)
    assert err.value.status == 400 and named in str(err.value)


def test_slo_headers_reach_the_request():
    raw = json.dumps({"model": "m", "prompt": "p"}).encode()
    req = parse(raw, {"X-SLO-TTFT-MS": "250"}).llm_request
    assert req.headers["x-slo-ttft-ms"] == "250"
