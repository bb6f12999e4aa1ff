"""P/D deciders: llm-d's prefix_based_pd_decider_test.go, always-disagg and the multimodal decider."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from scheduler import ConfigError, Endpoint, LLMRequest, PDDecider, Scheduler, load_config
from scheduler.plugins.deciders.always_disagg import AlwaysDisaggPDDecider
from scheduler.plugins.deciders.multimodal import AlwaysDisaggMultimodalDecider, has_multimodal_content
from scheduler.plugins.deciders.prefix_based import (
    PrefixBasedPDDecider,
    PrefixBasedPDDeciderParameters,
    input_tokens,
)
from scheduler.plugins.support.prefix import PREFIX_MATCH_KEY, PrefixCacheMatchInfo
from scheduler.registry import plugin_class
from tests.scheduler.helpers import fresh_state, request

TOTAL_TOKENS = 10
BLOCK_SIZE = 1


def decider(non_cached_tokens: int) -> PrefixBasedPDDecider:
    return PrefixBasedPDDecider(params=PrefixBasedPDDeciderParameters(nonCachedTokens=non_cached_tokens))


def decode_endpoint(cached_tokens: int | None, block_size: int = BLOCK_SIZE, total: int = TOTAL_TOKENS) -> Endpoint:
    """The decode target as a profile returns it: with the prefix scorer's match info attached."""
    attrs = {} if cached_tokens is None else {PREFIX_MATCH_KEY: PrefixCacheMatchInfo(cached_tokens, total, block_size)}
    return Endpoint("test-pod", address="10.0.0.1", port=8000, attributes=attrs)


def request_with_tokens(tokens: int) -> LLMRequest:
    """A completions request whose prompt is `tokens` tokens by llm-d's estimate (4 bytes each)."""
    return request(prompt="x" * (tokens * 4))


def chat(*blocks: dict, text: str = "describe this") -> LLMRequest:
    content = [{"type": "text", "text": text}, *blocks]
    return LLMRequest("r1", "m", body={"model": "m", "messages": [{"role": "user", "content": content}]})


IMAGE = {"type": "image_url", "image_url": {"url": "https://example.com/img.jpg"}}
VIDEO = {"type": "video_url", "video_url": {"url": "https://example.com/v.mp4"}}
AUDIO = {"type": "input_audio", "input_audio": {"data": "...", "format": "wav"}}


def test_types_registered_and_deciders():
    for type_name, cls in [
        ("prefix-based-pd-decider", PrefixBasedPDDecider),
        ("always-disagg-pd-decider", AlwaysDisaggPDDecider),
        ("always-disagg-multimodal-decider", AlwaysDisaggMultimodalDecider),
    ]:
        assert plugin_class(type_name) is cls
        assert issubclass(cls, PDDecider)


# -- getUserInputLenInTokens ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("req", "want"),
    [
        pytest.param(request(prompt="hello world hello world"), 5, id="completions prompt: 23 chars -> 5 tokens"),
        pytest.param(request(prompt=""), 0, id="empty completions prompt"),
        pytest.param(request(prompt="héllo wörld!"), 3, id="counted in UTF-8 bytes as llm-d (14 bytes)"),
        pytest.param(chat(), len(json.dumps(chat().body["messages"], separators=(",", ":"))) // 4, id="chat: JSON"),
        pytest.param(LLMRequest("r", "m", body={"model": "m"}), 0, id="neither prompt nor messages"),
    ],
)
def test_input_tokens(req, want):
    assert input_tokens(req) == want


# -- config validation and factory ------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "ok", "want"),
    [
        pytest.param({}, True, 0, id="default parameters"),
        pytest.param({"nonCachedTokens": 0}, True, 0, id="zero is valid"),
        pytest.param({"nonCachedTokens": 100}, True, 100, id="positive is valid"),
        pytest.param({"nonCachedTokens": 50}, True, 50, id="custom nonCachedTokens"),
        pytest.param({"nonCachedTokens": -1}, False, None, id="negative is invalid"),
        pytest.param({"nonCachedTokens": -5}, False, None, id="negative nonCachedTokens"),
        pytest.param({"nonCachedTokens": "many"}, False, None, id="not a number"),
        pytest.param({"threshold": 5}, False, None, id="unknown parameter"),
    ],
)
def test_parameters(params, ok, want):
    if not ok:
        with pytest.raises(ValidationError):
            PrefixBasedPDDeciderParameters.model_validate(params)
        return
    d = PrefixBasedPDDecider(name="my-decider", params=PrefixBasedPDDeciderParameters.model_validate(params))
    assert d.name == "my-decider"
    assert d.non_cached_tokens == want


def test_bad_parameter_is_a_load_error_naming_plugin_and_field():
    with pytest.raises(ConfigError) as err:
        load_config("plugins:\n- type: prefix-based-pd-decider\n  parameters: {nonCachedTokens: -5}\n")
    assert "'prefix-based-pd-decider'" in str(err.value)
    assert "parameters.nonCachedTokens" in str(err.value)


def test_decider_is_not_a_profile_plugin():
    with pytest.raises(ConfigError) as err:
        load_config(
            """
plugins:
- type: always-disagg-pd-decider
- type: queue-scorer
schedulingProfiles:
- name: default
  plugins: [{pluginRef: queue-scorer}, {pluginRef: always-disagg-pd-decider}]
"""
        )
    assert "can not be used in a profile" in str(err.value)


def test_a_config_of_only_a_decider_and_scorer_keeps_the_decider_out_of_the_default_profile():
    cfg = load_config("plugins:\n- type: queue-scorer\n- type: prefix-based-pd-decider\n")
    sched = Scheduler.from_config(cfg)
    assert "prefix-based-pd-decider" in sched.plugins
    assert [r.plugin_ref for r in cfg.scheduling_profiles[0].plugins] == ["queue-scorer", "max-score-picker"]


# -- disaggregate (llm-d's TestDisaggregate) -------------------------------------------------


@pytest.mark.parametrize(
    ("non_cached_tokens", "req", "endpoint", "want"),
    [
        pytest.param(0, request_with_tokens(10), decode_endpoint(5), False, id="threshold zero disables"),
        pytest.param(0, request_with_tokens(10), None, False, id="threshold zero with no endpoint"),
        pytest.param(5, request_with_tokens(10), None, False, id="no endpoint returns false"),
        pytest.param(20, request_with_tokens(10), decode_endpoint(0), False, id="input shorter than threshold"),
        pytest.param(5, request_with_tokens(10), decode_endpoint(8), False, id="non-cached suffix below threshold"),
        pytest.param(5, request_with_tokens(10), decode_endpoint(5), True, id="non-cached suffix equals threshold"),
        pytest.param(3, request_with_tokens(10), decode_endpoint(2), True, id="non-cached suffix above threshold"),
        pytest.param(1, request_with_tokens(10), decode_endpoint(10), False, id="fully cached prompt"),
        pytest.param(5, request_with_tokens(10), decode_endpoint(0), True, id="no cache hit at all"),
        # Blocks, not tokens: 2 matched blocks of 16 tokens cover 32 of 40 tokens.
        pytest.param(8, request_with_tokens(40), decode_endpoint(2, block_size=16), True, id="8 of 40 uncached >= 8"),
        pytest.param(9, request_with_tokens(40), decode_endpoint(2, block_size=16), False, id="8 of 40 uncached < 9"),
        pytest.param(4, request_with_tokens(40), decode_endpoint(3, block_size=16), False, id="cached beyond prompt"),
    ],
)
def test_disaggregate(non_cached_tokens, req, endpoint, want):
    assert decider(non_cached_tokens).disaggregate(fresh_state(), req, endpoint) is want


def test_no_prefix_info_never_disaggregates(caplog):
    d = decider(5)
    assert d.disaggregate(fresh_state(), request_with_tokens(100), decode_endpoint(None)) is False
    assert d.disaggregate(fresh_state(), request_with_tokens(100), decode_endpoint(None)) is False
    warnings = [r for r in caplog.records if "no prefix-cache match info" in r.getMessage()]
    assert len(warnings) == 1  # said once, not per request


def test_wrong_prefix_info_type_never_disaggregates():
    ep = Endpoint("test-pod", attributes={PREFIX_MATCH_KEY: {"match_blocks": 0}})
    assert decider(5).disaggregate(fresh_state(), request_with_tokens(100), ep) is False


# -- always-disagg-pd-decider and always-disagg-multimodal-decider ----------------------------


@pytest.mark.parametrize(
    "req", [request(prompt=""), request_with_tokens(1000), chat(IMAGE)], ids=["empty", "long", "multimodal"]
)
def test_always_disagg(req):
    assert AlwaysDisaggPDDecider().disaggregate(fresh_state(), req, decode_endpoint(10)) is True


@pytest.mark.parametrize(
    ("body", "want"),
    [
        pytest.param({}, False, id="no body"),
        pytest.param({"prompt": "an image_url here"}, False, id="completions"),
        pytest.param(chat().body, False, id="text only"),
        pytest.param(chat(IMAGE).body, True, id="image"),
        pytest.param(chat(VIDEO).body, True, id="video"),
        pytest.param(chat(AUDIO).body, True, id="audio"),
        pytest.param(chat(IMAGE, VIDEO, AUDIO).body, True, id="all types"),
        pytest.param({"messages": [{"role": "user", "content": "image_url"}]}, False, id="string content"),
        pytest.param({"messages": "garbage"}, False, id="malformed messages"),
    ],
)
def test_multimodal_decider(body, want):
    assert has_multimodal_content(body) is want
    req = LLMRequest("r", "m", body=body)
    assert AlwaysDisaggMultimodalDecider().disaggregate(fresh_state(), req, decode_endpoint(0)) is want
