"""disagg-profile-handler and its older name pd-profile-handler: llm-d's disagg_profile_handler_test.go
and pd_profile_handler_test.go cases (factory, Pick, ProcessResults), plus the load-time checks."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from scheduler import (
    ConfigError,
    Endpoint,
    ErrorCode,
    LLMRequest,
    ProfileRunResult,
    Scheduler,
    SchedulingError,
    load_config,
)
from scheduler.cycle_state import profile_error_key
from scheduler.interfaces import PluginHandle
from scheduler.plugins.deciders.always_disagg import AlwaysDisaggPDDecider
from scheduler.plugins.deciders.multimodal import AlwaysDisaggMultimodalDecider
from scheduler.plugins.deciders.prefix_based import PrefixBasedPDDecider, PrefixBasedPDDeciderParameters
from scheduler.plugins.handlers.disagg import (
    DISAGG_DECISION_KEY,
    DisaggProfileHandler,
    DisaggProfileHandlerParameters,
    Named,
    decision_type,
)
from scheduler.plugins.handlers.pd_profile import PdProfileHandler
from scheduler.plugins.support.prefix import PREFIX_MATCH_KEY, PrefixCacheMatchInfo
from scheduler.registry import plugin_class
from tests.scheduler.helpers import fresh_state, request

DECODE, PREFILL, ENCODE = "decode", "prefill", "encode"
LONG_PROMPT = "hello world hello world hello world"  # 35 chars: 8 tokens


def prefix_decider(non_cached_tokens: int, name: str = "prefix-based-pd-decider") -> PrefixBasedPDDecider:
    return PrefixBasedPDDecider(name, PrefixBasedPDDeciderParameters(nonCachedTokens=non_cached_tokens))


def handle(**plugins) -> PluginHandle:
    return PluginHandle(lambda name: plugins[name], list(plugins))


def handle_with_deciders() -> PluginHandle:
    """llm-d's handleWithDeciders: every decider type registered under its type name."""
    return handle(
        **{
            "prefix-based-pd-decider": prefix_decider(4),
            "always-disagg-pd-decider": AlwaysDisaggPDDecider(),
            "always-disagg-multimodal-decider": AlwaysDisaggMultimodalDecider(),
            "queue-scorer": plugin_class("queue-scorer")(),
        }
    )


def build(params: dict[str, Any], cls=DisaggProfileHandler, plugins: PluginHandle | None = None):
    plugins = plugins if plugins is not None else handle_with_deciders()
    return cls(name="h", params=cls.Parameters.model_validate(params), handle=plugins)


def handler(pd=None, encode=None, decode_profile=DECODE, prefill_profile=PREFILL, encode_profile=ENCODE):
    """llm-d's NewDisaggProfileHandler(decode, prefill, encode, pdDecider, encodeDecider)."""
    plugins = {}
    if pd is not None:
        plugins["pd"] = pd
    if encode is not None:
        plugins["enc"] = encode
    params = {
        "profiles": {"decode": decode_profile, "prefill": prefill_profile, "encode": encode_profile},
        "deciders": {"prefill": "pd" if pd is not None else "", "encode": "enc" if encode is not None else ""},
    }
    return build(params, plugins=handle(**plugins))


def result_of(*names: str, cached_tokens: int | None = None, input_tokens: int = 0) -> ProfileRunResult:
    """llm-d's makeProfileRunResult, with injectPrefixCache's match info (block size 1) on the targets."""
    attrs = {}
    if cached_tokens is not None:
        attrs = {PREFIX_MATCH_KEY: PrefixCacheMatchInfo(cached_tokens, input_tokens, 1)}
    return ProfileRunResult(
        [Endpoint(n, address=f"10.0.0.{i + 1}", port=8000, attributes=dict(attrs)) for i, n in enumerate(names)]
    )


def completions(prompt: str) -> LLMRequest:
    return request(prompt=prompt)


def chat(image=False, video=False, audio=False, prompt: str | None = None) -> LLMRequest:
    blocks: list[dict[str, Any]] = [{"type": "text", "text": "describe this"}]
    if image:
        blocks.append({"type": "image_url", "image_url": {"url": "https://example.com/img.jpg"}})
    if video:
        blocks.append({"type": "video_url"})
    if audio:
        blocks.append({"type": "input_audio"})
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": blocks}]}
    if prompt is not None:
        body = {"model": "m", "prompt": prompt, "messages": body["messages"]}
    return LLMRequest("r1", "m", body=body)


def tokens(req: LLMRequest) -> int:
    return len(req.prompt_text().encode()) // 4


def pick(h, req, profile_names, results, cycle_state=None) -> list[str]:
    profiles = {n: object() for n in profile_names}
    got = h.pick(cycle_state if cycle_state is not None else fresh_state(), req, profiles, results)
    assert all(got[n] is profiles[n] for n in got)
    return sorted(got)


def test_types():
    assert plugin_class("disagg-profile-handler") is DisaggProfileHandler
    assert plugin_class("pd-profile-handler") is PdProfileHandler
    h = handler()
    assert h.name == "h" and h.type_name == "disagg-profile-handler"
    assert DisaggProfileHandler().name == "disagg-profile-handler"


# -- factory (TestHandlerFactory, _DeprecatedFlatParams, _PdProfileHandlerParams, _NilDeciders) ---


@pytest.mark.parametrize(
    ("params", "ok"),
    [
        pytest.param({}, True, id="decode only defaults"),
        pytest.param({"deciders": {"prefill": "always-disagg-pd-decider"}}, True, id="PD style"),
        pytest.param(
            {
                "profiles": {"decode": "my-decode", "prefill": "my-prefill"},
                "deciders": {"prefill": "prefix-based-pd-decider"},
            },
            True,
            id="PD custom profiles",
        ),
        pytest.param({"profiles": {"encode": "encode"}}, True, id="EPD style"),
        pytest.param(
            {"profiles": {"encode": "encode"}, "deciders": {"encode": "always-disagg-multimodal-decider"}},
            True,
            id="EPD with encode decider",
        ),
        pytest.param(
            {
                "profiles": {"prefill": "prefill", "encode": "encode"},
                "deciders": {"prefill": "prefix-based-pd-decider", "encode": "always-disagg-multimodal-decider"},
            },
            True,
            id="full EPD",
        ),
        pytest.param({"profiles": {"prefill": "prefill"}}, True, id="prefill without decider is ok (stage inactive)"),
        pytest.param({"profiles": {"prefill": "prefill", "encode": "encode"}}, True, id="both profiles, no deciders"),
        pytest.param(
            {"profiles": {"prefill": "prefill"}, "deciders": {"prefill": "INVALID"}}, False, id="unknown pdDecider"
        ),
        pytest.param({"deciders": {"encode": "INVALID"}}, False, id="unknown encodeDecider"),
        pytest.param({"deciders": {"prefill": "queue-scorer"}}, False, id="decider that is not a decider"),
        pytest.param({"deciders": {"decode": "always-disagg-pd-decider"}}, False, id="decode takes no decider"),
        # deprecated flat parameters
        pytest.param({"prefillDeciderPluginName": "prefix-based-pd-decider"}, True, id="flat prefillDeciderPluginName"),
        pytest.param(
            {"encodeDeciderPluginName": "always-disagg-multimodal-decider"}, True, id="flat encodeDeciderPluginName"
        ),
        pytest.param(
            {
                "decodeProfile": "my-decode",
                "prefillProfile": "my-prefill",
                "encodeProfile": "my-encode",
                "prefillDeciderPluginName": "prefix-based-pd-decider",
            },
            True,
            id="flat custom profile names",
        ),
        pytest.param(
            {"decodeProfile": "my-decode", "profiles": {"decode": "other-decode"}}, False, id="mixing flat and nested"
        ),
        pytest.param(
            {
                "prefillDeciderPluginName": "prefix-based-pd-decider",
                "deciders": {"prefill": "always-disagg-pd-decider"},
            },
            False,
            id="mixing flat decider and nested deciders",
        ),
        # llm-d accepts unknown fields here; our configs reject them (a typo is a load-time error).
        pytest.param(
            {"profiles": {"decode": "decode"}, "unknownField": "ignored"}, False, id="unknown field is an error"
        ),
        # pd-profile-handler's parameters on disagg-profile-handler (a zero-change migration)
        pytest.param(
            {"decodeProfile": "decode", "prefillProfile": "prefill", "deciderPluginName": "prefix-based-pd-decider"},
            True,
            id="pd-profile-handler with deciderPluginName",
        ),
        pytest.param(
            {
                "decodeProfile": "decode",
                "prefillProfile": "prefill",
                "deciderPluginName": "prefix-based-pd-decider",
                "prefixPluginType": "prefix-cache-scorer",
                "prefixPluginName": "prefix-cache-scorer",
                "primaryPort": 8080,
            },
            True,
            id="pd-profile-handler with all params including ignored fields",
        ),
        pytest.param({"deciderPluginName": "INVALID"}, False, id="pd-profile-handler unknown deciderPluginName"),
        pytest.param({"deciders": "prefix-based-pd-decider"}, False, id="deciders not a mapping"),
    ],
)
def test_factory(params, ok):
    if ok:
        assert isinstance(build(params), DisaggProfileHandler)
    else:
        with pytest.raises(ValueError):  # pydantic's ValidationError is a ValueError
            build(params)


def test_flat_params_resolve_like_nested():
    h = build(
        {
            "decodeProfile": "my-decode",
            "prefillProfile": "my-prefill",
            "encodeProfile": "my-encode",
            "deciderPluginName": "always-disagg-pd-decider",  # the lower-priority alias…
            "prefillDeciderPluginName": "prefix-based-pd-decider",  # …loses to this one
            "encodeDeciderPluginName": "always-disagg-multimodal-decider",
        }
    )
    assert (h.decode_profile, h.prefill_profile, h.encode_profile) == ("my-decode", "my-prefill", "my-encode")
    stages = {s.name: s for s in h.stages}
    assert stages["prefill"].decider.type_name == "prefix-based-pd-decider"
    assert stages["encode"].decider.type_name == "always-disagg-multimodal-decider"


@pytest.mark.parametrize(
    ("params", "fields"),
    [
        pytest.param(
            {"profiles": {"decode": "d", "prefill": "p"}, "deciders": {"prefill": "x"}},
            ("profiles.decode", "profiles.prefill", "deciders.prefill"),
            id="nested",
        ),
        pytest.param(
            {"decodeProfile": "d", "prefillProfile": "p", "prefillDeciderPluginName": "x"},
            ("decodeProfile", "prefillProfile", "prefillDeciderPluginName"),
            id="flat",
        ),
        pytest.param(
            {"decodeProfile": "d", "prefillProfile": "p", "deciderPluginName": "x", "hashBlockSize": 16},
            ("decodeProfile", "prefillProfile", "deciderPluginName"),
            id="pd-profile-handler's",
        ),
    ],
)
def test_the_three_parameter_shapes_normalise_alike(params, fields):
    p = DisaggProfileHandlerParameters.model_validate(params)
    decode_field, prefill_field, decider_field = fields
    assert p.profile("decode") == Named("d", decode_field)
    assert p.profile("prefill") == Named("p", prefill_field)
    assert p.decider("prefill") == Named("x", decider_field)
    assert p.profile("encode") == Named() and p.decider("encode") == Named()


def test_defaults_and_empty_strings():
    h = build({"profiles": {"decode": "", "prefill": ""}})
    assert (h.decode_profile, h.prefill_profile, h.encode_profile) == (DECODE, PREFILL, ENCODE)
    assert all(s.decider is None for s in h.stages)


# -- Pick: P/D (TestHandler_Pick_PD, TestPdProfileHandler_Pick) -----------------------------------


@pytest.mark.parametrize("cls", [DisaggProfileHandler, PdProfileHandler])
@pytest.mark.parametrize(
    ("non_cached_tokens", "cached_tokens", "results", "want"),
    [
        pytest.param(4, 0, {}, [DECODE], id="decode not run -> run decode"),
        pytest.param(4, 0, {DECODE: None}, [], id="decode failed -> done"),
        pytest.param(4, 0, {DECODE: ProfileRunResult([])}, [], id="decode picked nothing -> done"),
        pytest.param(4, 0, {DECODE: "pod1", PREFILL: "pod2"}, [], id="all profiles done -> done"),
        pytest.param(4, 0, {DECODE: "pod1", PREFILL: None}, [], id="prefill ran and failed -> done"),
        pytest.param(4, 2, {DECODE: "pod1"}, [PREFILL], id="enough uncached tokens -> run prefill"),
        pytest.param(4, 5, {DECODE: "pod1"}, [], id="short uncached suffix -> skip prefill"),
        pytest.param(10, 0, {DECODE: "pod1"}, [], id="prompt shorter than threshold -> skip prefill"),
        pytest.param(0, 0, {DECODE: "pod1"}, [], id="nonCachedTokens 0 disables"),
    ],
)
def test_pick_pd(cls, non_cached_tokens, cached_tokens, results, want):
    req = completions(LONG_PROMPT)
    results = {
        name: result_of(r, cached_tokens=cached_tokens, input_tokens=tokens(req)) if isinstance(r, str) else r
        for name, r in results.items()
    }
    h = build(
        {"profiles": {"decode": DECODE, "prefill": PREFILL}, "deciders": {"prefill": "pd"}},
        cls,
        handle(pd=prefix_decider(non_cached_tokens)),
    )
    assert pick(h, req, [DECODE, PREFILL], results) == want


def test_pick_pd_no_prompt_never_disaggregates():
    """TestHandler_Pick_PD_InputTokenError: a body with neither prompt nor messages."""
    req = LLMRequest("r1", "m", body={"model": "m"})
    h = handler(pd=prefix_decider(1))
    assert pick(h, req, [DECODE, PREFILL], {DECODE: result_of("pod1", cached_tokens=0)}) == []


@pytest.mark.parametrize("cls", [DisaggProfileHandler, PdProfileHandler])
@pytest.mark.parametrize(
    ("non_cached_tokens", "steps"),
    [
        pytest.param(
            2,
            [("hello world, hello world!", 0, [PREFILL]), ("hello world, hello world!", "all", [])],
            id="same request twice: first disaggregates, second hits cache",
        ),
        pytest.param(
            2,
            [
                ("hello world, hello world!", 0, [PREFILL]),
                ("hello world, hello world! and some additional padding text here", 6, [PREFILL]),
            ],
            id="short then long: long triggers disaggregation",
        ),
        pytest.param(
            2,
            [("x" * 89, 0, [PREFILL]), ("x" * 89 + "123", 22, [])],
            id="short request and a little bit longer after it",
        ),
        pytest.param(
            2,
            [("x" * 89, 0, [PREFILL]), ("x" * 178, 22, [PREFILL])],
            id="short request and a long one after it",
        ),
    ],
)
def test_pick_pd_series(cls, non_cached_tokens, steps):
    """TestHandler_Pick_PD_Series / TestPdProfileHandler_PickSeries: one handler, several requests."""
    h = build({"deciders": {"prefill": "pd"}}, cls, handle(pd=prefix_decider(non_cached_tokens)))
    for prompt, cached, want in steps:
        req = completions(prompt)
        cached = tokens(req) if cached == "all" else cached
        results = {DECODE: result_of("pod1", cached_tokens=cached, input_tokens=tokens(req))}
        assert pick(h, req, [DECODE, PREFILL], results) == want, prompt


def test_pick_asks_the_decider_once_and_about_the_decode_target():
    seen = []

    class Recording(AlwaysDisaggPDDecider):
        def disaggregate(self, cycle_state, request, decode_endpoint):
            seen.append(decode_endpoint.name)
            return False

    h = handler(pd=Recording("rec"))
    state = fresh_state()
    results = {DECODE: result_of("pod-d", "pod-x")}
    assert pick(h, completions(LONG_PROMPT), [DECODE, PREFILL], results, state) == []
    assert pick(h, completions(LONG_PROMPT), [DECODE, PREFILL], results, state) == []
    assert seen == ["pod-d"]


# -- ProcessResults (TestHandler_ProcessResults_PD / _EPD_Full / _NilDeciders, Pd's) -------------


@pytest.mark.parametrize("cls", [DisaggProfileHandler, PdProfileHandler])
@pytest.mark.parametrize(
    ("results", "want"),
    [
        pytest.param({DECODE: "pod1"}, {DECODE: ["pod1"]}, id="decode only"),
        pytest.param({DECODE: "pod1", PREFILL: "pod2"}, {DECODE: ["pod1"], PREFILL: ["pod2"]}, id="decode + prefill"),
        pytest.param({DECODE: "pod1", PREFILL: None}, {DECODE: ["pod1"], PREFILL: None}, id="prefill failed: None"),
        pytest.param(
            {DECODE: "pod1", ENCODE: "pod2", PREFILL: "pod3"},
            {DECODE: ["pod1"], ENCODE: ["pod2"], PREFILL: ["pod3"]},
            id="all three stages",
        ),
        # llm-d drops a failed stage's entry; GIE (PR #1013) keeps it as None.
        pytest.param(
            {DECODE: "pod1", ENCODE: None, PREFILL: "pod3"},
            {DECODE: ["pod1"], ENCODE: None, PREFILL: ["pod3"]},
            id="encode failed: None",
        ),
    ],
)
def test_process_results(cls, results, want):
    results = {n: result_of(r) if isinstance(r, str) else r for n, r in results.items()}
    h = build({}, cls, handle())
    req = request()
    got = h.process_results(fresh_state(), req, results)
    assert got.primary_profile_name == DECODE
    assert got.prefill_profile_name == PREFILL
    assert got.to_json()["profiles"] == want
    assert got.target.port == 8000  # no primaryPort rewrite
    assert req.headers == {}


@pytest.mark.parametrize("cls", [DisaggProfileHandler, PdProfileHandler])
def test_process_results_decode_failed_fails_the_request(cls):
    h = build({}, cls, handle())
    with pytest.raises(SchedulingError) as err:
        h.process_results(fresh_state(), request(), {DECODE: None, PREFILL: result_of("pod2")})
    assert err.value.code is ErrorCode.RESOURCE_EXHAUSTED  # profile_failure's default, as GIE's director
    assert "failed to find available decode workers" in err.value.message
    with pytest.raises(SchedulingError) as err:
        h.process_results(fresh_state(), request(), {DECODE: ProfileRunResult([])})
    assert "decode workers" in err.value.message


def test_process_results_decode_failure_keeps_the_filters_code():
    state = fresh_state()
    state.write(profile_error_key(DECODE), SchedulingError(ErrorCode.SERVICE_UNAVAILABLE, "all pods are draining"))
    with pytest.raises(SchedulingError) as err:
        handler().process_results(state, request(), {DECODE: None})
    assert err.value.code is ErrorCode.SERVICE_UNAVAILABLE
    assert "all pods are draining" in err.value.message


def test_process_results_without_decode_is_internal():
    with pytest.raises(SchedulingError) as err:
        handler().process_results(fresh_state(), request(), {PREFILL: result_of("pod2")})
    assert err.value.code is ErrorCode.INTERNAL


def test_primary_port_is_accepted_and_ignored():
    """pd_profile_handler_test's "with primaryPort": llm-d rewrites the decode port and sets
    x-data-parallel-host-port; our gateway forwards to the rank's own port, so neither happens."""
    h = build({"primaryPort": 9000}, PdProfileHandler, handle())
    req = request()
    got = h.process_results(fresh_state(), req, {DECODE: result_of("pod1")})
    assert got.target.port == 8000
    assert "x-data-parallel-host-port" not in req.headers


# -- custom profile names (TestHandler_Pick_CustomProfiles / ProcessResults_CustomProfiles) -----


def test_custom_profiles():
    h = handler(
        pd=prefix_decider(1),
        encode=AlwaysDisaggMultimodalDecider(),
        decode_profile="my-decode",
        prefill_profile="my-prefill",
        encode_profile="my-encode",
    )
    names = ["my-decode", "my-prefill", "my-encode"]
    assert pick(h, chat(image=True), names, {}) == ["my-decode"]
    assert pick(h, chat(image=True), names, {"my-decode": result_of("pod1")}) == ["my-encode"]
    got = h.process_results(
        fresh_state(),
        request(),
        {"my-decode": result_of("pod1"), "my-prefill": result_of("pod2"), "my-encode": result_of("pod3")},
    )
    assert got.primary_profile_name == "my-decode"
    assert got.prefill_profile_name == "my-prefill"
    assert set(got.profile_results) == set(names)


# -- E/PD and E/P/D (TestHandler_Pick_EPD, _EPD_Full, _EPD_Full_EncodeDecider) -------------------


@pytest.mark.parametrize(
    ("req", "results", "want"),
    [
        pytest.param(chat(image=True), {}, [DECODE], id="decode not run -> run decode"),
        pytest.param(chat(image=True), {DECODE: None}, [], id="decode failed -> done"),
        pytest.param(chat(), {DECODE: "pod1"}, [], id="no multimodal -> skip encode"),
        pytest.param(chat(image=True), {DECODE: "pod1"}, [ENCODE], id="image -> run encode"),
        pytest.param(chat(video=True), {DECODE: "pod1"}, [ENCODE], id="video -> run encode"),
        pytest.param(chat(audio=True), {DECODE: "pod1"}, [ENCODE], id="audio -> run encode"),
        pytest.param(chat(image=True), {DECODE: "pod1", ENCODE: None}, [], id="encode failed -> done"),
        pytest.param(chat(image=True), {DECODE: "pod1", ENCODE: "pod2"}, [], id="all profiles done -> done"),
    ],
)
def test_pick_epd(req, results, want):
    results = {n: result_of(r) if isinstance(r, str) else r for n, r in results.items()}
    h = handler(encode=AlwaysDisaggMultimodalDecider())
    assert pick(h, req, [DECODE, ENCODE], results) == want


@pytest.mark.parametrize(
    ("req", "non_cached_tokens", "cached", "results", "want"),
    [
        pytest.param(chat(image=True, prompt=LONG_PROMPT), 1, 0, {DECODE: "pod1"}, [ENCODE], id="mm: encode first"),
        pytest.param(
            chat(image=True, prompt=LONG_PROMPT),
            1,
            0,
            {DECODE: "pod1", ENCODE: "pod2"},
            [PREFILL],
            id="mm, encode done -> prefill",
        ),
        pytest.param(completions(LONG_PROMPT), 1, 0, {DECODE: "pod1"}, [PREFILL], id="text: skip encode, prefill"),
        pytest.param(completions(LONG_PROMPT), 100, 0, {DECODE: "pod1"}, [], id="text, short: decode only"),
        pytest.param(
            chat(image=True, prompt=LONG_PROMPT),
            1,
            "all",
            {DECODE: "pod1", ENCODE: "pod2"},
            [],
            id="mm, all cached: no prefill",
        ),
        pytest.param(
            chat(image=True, prompt=LONG_PROMPT),
            1,
            0,
            {DECODE: "pod1", ENCODE: "pod2", PREFILL: "pod3"},
            [],
            id="all stages done",
        ),
    ],
)
def test_pick_epd_full(req, non_cached_tokens, cached, results, want):
    cached = tokens(req) if cached == "all" else cached
    results = {
        n: result_of(r, cached_tokens=cached, input_tokens=tokens(req)) if isinstance(r, str) else r
        for n, r in results.items()
    }
    h = handler(pd=prefix_decider(non_cached_tokens), encode=AlwaysDisaggMultimodalDecider())
    assert pick(h, req, [DECODE, PREFILL, ENCODE], results) == want


@pytest.mark.parametrize(("allow", "want"), [(True, [ENCODE]), (False, [PREFILL])])
def test_pick_epd_encode_decider_decides(allow, want):
    class Fixed(AlwaysDisaggPDDecider):
        def disaggregate(self, cycle_state, request, decode_endpoint):
            return allow

    req = chat(image=True, prompt=LONG_PROMPT)
    h = handler(pd=prefix_decider(1), encode=Fixed("fixed"))
    results = {DECODE: result_of("pod1", cached_tokens=0, input_tokens=tokens(req))}
    assert pick(h, req, [DECODE, PREFILL, ENCODE], results) == want


# -- no deciders (TestHandler_Pick_NilDeciders) ----------------------------------------------------


@pytest.mark.parametrize(
    ("pd", "encode", "req", "results", "want"),
    [
        pytest.param(None, None, "mm", {}, [DECODE], id="both nil, decode not run -> decode"),
        pytest.param(None, None, "mm", {DECODE: "pod1"}, [], id="both nil, decode done -> skip both"),
        pytest.param(None, "mm", "mm", {DECODE: "pod1"}, [ENCODE], id="pd nil, multimodal -> encode"),
        pytest.param(None, "mm", "mm", {DECODE: "pod1", ENCODE: "pod2"}, [], id="pd nil, encode done -> done"),
        pytest.param("always", None, "text", {DECODE: "pod1"}, [PREFILL], id="encode nil, text -> prefill"),
        pytest.param("always", None, "mm", {DECODE: "pod1"}, [PREFILL], id="encode nil, mm -> skip encode, prefill"),
    ],
)
def test_pick_no_deciders(pd, encode, req, results, want):
    h = handler(
        pd=AlwaysDisaggPDDecider() if pd else None,
        encode=AlwaysDisaggMultimodalDecider() if encode else None,
    )
    req = chat(image=True, prompt=LONG_PROMPT) if req == "mm" else completions(LONG_PROMPT)
    results = {n: result_of(r, cached_tokens=0, input_tokens=tokens(req)) for n, r in results.items()}
    assert pick(h, req, [DECODE, PREFILL, ENCODE], results) == want


def test_stage_without_its_profile_is_not_run():
    h = handler(pd=AlwaysDisaggPDDecider(), encode=AlwaysDisaggMultimodalDecider())
    assert pick(h, chat(image=True, prompt=LONG_PROMPT), [DECODE], {DECODE: result_of("pod1")}) == []


# -- the decision record ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("profiles", "rounds", "want"),
    [
        pytest.param(
            [DECODE, PREFILL],
            [{DECODE: "pod1"}, {PREFILL: "pod2"}],
            {"decode": "ran", "prefill": "ran", "decision": "prefill-decode"},
            id="P/D",
        ),
        pytest.param(
            [DECODE, PREFILL],
            [{DECODE: "pod1"}, {PREFILL: None}],
            {"decode": "ran", "prefill": "failed", "decision": "decode-only"},
            id="prefill failed",
        ),
        pytest.param([DECODE, PREFILL], [{DECODE: None}], {"decode": "failed"}, id="decode failed"),
        pytest.param([DECODE], [{DECODE: "pod1"}], {"decode": "ran", "decision": "decode-only"}, id="decode only"),
    ],
)
def test_decision_record(profiles, rounds, want):
    h = handler(pd=AlwaysDisaggPDDecider())
    state, results = fresh_state(), {}
    for round_results in rounds:
        assert pick(h, completions(LONG_PROMPT), profiles, results, state) == sorted(round_results)
        results.update({n: result_of(r) if isinstance(r, str) else r for n, r in round_results.items()})
    assert pick(h, completions(LONG_PROMPT), profiles, results, state) == []
    assert state.read(DISAGG_DECISION_KEY) == want


def test_decision_record_skipped():
    h = handler(pd=prefix_decider(100))
    state = fresh_state()
    pick(h, completions(LONG_PROMPT), [DECODE, PREFILL], {DECODE: result_of("pod1", cached_tokens=0)}, state)
    assert state.read(DISAGG_DECISION_KEY) == {"decode": "ran", "prefill": "skipped", "decision": "decode-only"}


@pytest.mark.parametrize(
    ("encode", "prefill", "want"),
    [
        (False, False, "decode-only"),
        (False, True, "prefill-decode"),
        (True, False, "encode-decode"),
        (True, True, "encode-prefill-decode"),
    ],
)
def test_decision_type(encode, prefill, want):
    assert decision_type(encode, prefill) == want


# -- pd-profile-handler: its own factory cases and `threshold` -------------------------------------


@pytest.mark.parametrize(
    ("params", "ok"),
    [
        pytest.param({}, True, id="valid configuration with all defaults"),
        pytest.param(
            {
                "decodeProfile": "my-decode",
                "prefillProfile": "my-prefill",
                "prefixPluginName": "my-prefix-cache",
                "primaryPort": 8080,
                "deciderPluginName": "prefix-based-pd-decider",
            },
            True,
            id="valid configuration with custom values",
        ),
        pytest.param({"primaryPort": 0}, True, id="zero primaryPort is allowed"),
        pytest.param({"deciderPluginName": "prefix-based-pd-decider"}, True, id="named decider"),
        pytest.param({"primaryPort": 1}, True, id="primaryPort = 1 is valid"),
        pytest.param({"primaryPort": 65535}, True, id="primaryPort = 65535 is valid"),
        pytest.param({"decodeProfile": ""}, True, id="empty decodeProfile is valid"),
        pytest.param({"prefillProfile": ""}, True, id="empty prefillProfile is valid"),
        pytest.param({"prefixPluginName": ""}, True, id="empty prefixPluginName is valid"),
        pytest.param({"primaryPort": 65536}, False, id="primaryPort = 65536 should error"),
        pytest.param({"primaryPort": -10}, False, id="primaryPort = -10 should error"),
        pytest.param({"primaryPort": 8080.5}, False, id="primaryPort as float"),
        pytest.param({"deciderPluginName": "INVALID"}, False, id="invalid decider plugin type"),
        # the parameters of llm-d's pd-profile-handler before deciders (up to early 2026)
        pytest.param({"threshold": 10, "hashBlockSize": 5}, True, id="threshold and hashBlockSize"),
        pytest.param({"threshold": 0}, True, id="threshold 0"),
        pytest.param({"threshold": -1}, False, id="invalid threshold: must be >= 0"),
        pytest.param({"hashBlockSize": 0}, False, id="invalid hashBlockSize: must be > 0"),
        pytest.param(
            {"threshold": 10, "deciderPluginName": "prefix-based-pd-decider"}, False, id="threshold and a decider"
        ),
    ],
)
def test_pd_profile_handler_factory(params, ok):
    if ok:
        assert isinstance(build(params, PdProfileHandler), PdProfileHandler)
    else:
        with pytest.raises((ValidationError, ValueError)):
            build(params, PdProfileHandler)


@pytest.mark.parametrize(
    ("params", "plugins", "want_type", "want_tokens"),
    [
        pytest.param({"threshold": 10}, {}, "prefix-based-pd-decider", 10, id="threshold > 0: prefix-based"),
        pytest.param({"threshold": 0}, {}, "always-disagg-pd-decider", None, id="threshold 0: always"),
        pytest.param({}, {}, "always-disagg-pd-decider", None, id="no decider, no threshold: always"),
        pytest.param(
            {}, {"prefix-based-pd-decider": prefix_decider(7)}, "prefix-based-pd-decider", 7, id="default decider name"
        ),
        pytest.param(
            {"threshold": 3},
            {"prefix-based-pd-decider": prefix_decider(7)},
            "prefix-based-pd-decider",
            3,
            id="threshold wins over the default name",
        ),
        pytest.param(
            {"deciderPluginName": "mine"},
            {"mine": AlwaysDisaggPDDecider("mine")},
            "always-disagg-pd-decider",
            None,
            id="named decider",
        ),
    ],
)
def test_pd_profile_handler_prefill_decider(params, plugins, want_type, want_tokens):
    h = build(params, PdProfileHandler, handle(**plugins))
    decider = next(s.decider for s in h.stages if s.name == "prefill")
    assert decider.type_name == want_type
    if want_tokens is not None:
        assert decider.non_cached_tokens == want_tokens


def test_disagg_handler_threshold_too_and_no_decider_means_decode_only():
    h = build({"threshold": 10}, DisaggProfileHandler, handle())
    assert next(s.decider for s in h.stages if s.name == "prefill").non_cached_tokens == 10
    h = build({}, DisaggProfileHandler, handle(**{"prefix-based-pd-decider": prefix_decider(7)}))
    assert all(s.decider is None for s in h.stages)  # disagg-profile-handler needs deciders.prefill


@pytest.mark.parametrize(
    ("threshold", "cached", "want"),
    [(0, 8, [PREFILL]), (4, 2, [PREFILL]), (4, 5, []), (100, 0, [])],
    ids=["0 always", "6 uncached >= 4", "3 uncached < 4", "prompt shorter than threshold"],
)
def test_pd_profile_handler_threshold_decides(threshold, cached, want):
    h = build({"threshold": threshold}, PdProfileHandler, handle())
    req = completions(LONG_PROMPT)
    results = {DECODE: result_of("pod1", cached_tokens=cached, input_tokens=tokens(req))}
    assert pick(h, req, [DECODE, PREFILL], results) == want


# -- load-time checks of the configured profile names ---------------------------------------------


@pytest.mark.parametrize(
    ("params", "profiles", "errors"),
    [
        pytest.param({}, [DECODE, PREFILL], [], id="defaults"),
        pytest.param({}, [DECODE], [], id="decode only"),
        pytest.param({"deciders": {"prefill": "pd"}}, [PREFILL, DECODE], [], id="P/D"),
        pytest.param({"profiles": {"decode": "d", "prefill": "p"}}, ["d", "p"], [], id="custom names"),
        pytest.param({}, [PREFILL], ["decode profile 'decode' is not a configured"], id="no decode profile"),
        pytest.param(
            {"profiles": {"decode": "d"}},
            [DECODE],
            ["parameters.profiles.decode: the decode profile 'd'", "['decode'] would never run"],
            id="named decode profile missing",
        ),
        pytest.param(
            {"profiles": {"prefill": "p"}}, [DECODE], ["parameters.profiles.prefill: the prefill profile 'p'"]
        ),
        pytest.param(
            {"prefillProfile": "p"}, [DECODE], ["parameters.prefillProfile: the prefill profile 'p'"], id="flat name"
        ),
        pytest.param(
            {"deciders": {"prefill": "pd"}},
            [DECODE],
            ["parameters.deciders.prefill: a prefill decider is set but there is no prefill profile 'prefill'"],
            id="decider without its profile",
        ),
        pytest.param(
            {"profiles": {"decode": "x", "prefill": "x"}}, ["x"], ["must differ"], id="decode and prefill the same"
        ),
        pytest.param({}, [DECODE, PREFILL, "extra"], ["['extra'] would never run"], id="a profile never run"),
    ],
)
def test_validate_profiles(params, profiles, errors):
    h = build(params, plugins=handle(pd=AlwaysDisaggPDDecider()))
    got = h.validate_profiles(profiles)
    assert len(got) == len(errors), got
    for fragment, message in zip(errors, got, strict=True):
        assert fragment in message


PD_PROFILES = """
schedulingProfiles:
- name: prefill
  plugins: [{pluginRef: prefill-filter}, {pluginRef: queue-scorer}]
- name: decode
  plugins: [{pluginRef: decode-filter}, {pluginRef: queue-scorer}]
"""


@pytest.mark.parametrize(
    ("plugins", "error"),
    [
        pytest.param(
            "- type: disagg-profile-handler\n  parameters: {deciders: {prefill: nope}}",
            "(type disagg-profile-handler): parameters.deciders.prefill: no plugin named 'nope'",
            id="dangling decider",
        ),
        pytest.param(
            "- type: disagg-profile-handler\n  parameters: {deciders: {prefill: queue-scorer}}",
            "parameters.deciders.prefill: plugin 'queue-scorer' (type queue-scorer) is not a decider",
            id="decider of the wrong kind",
        ),
        pytest.param(
            "- type: disagg-profile-handler\n  parameters: {profiles: {decode: dec}}",
            "parameters.profiles.decode: the decode profile 'dec' is not a configured scheduling profile",
            id="decode profile missing",
        ),
        pytest.param(
            "- type: disagg-profile-handler\n  parameters: {decodeProfile: decode, deciders: {prefill: d}}",
            "'disagg-profile-handler' (type disagg-profile-handler): parameters: cannot mix the deprecated flat",
            id="mixed formats",
        ),
        pytest.param(
            "- type: pd-profile-handler\n  parameters: {threshold: -1}",
            "'pd-profile-handler' (type pd-profile-handler): parameters.threshold:",
            id="negative threshold",
        ),
    ],
)
def test_config_errors_name_plugin_and_field(plugins, error):
    text = f"plugins:\n- type: prefill-filter\n- type: decode-filter\n- type: queue-scorer\n{plugins}\n{PD_PROFILES}"
    with pytest.raises(ConfigError) as err:
        load_config(text)
    assert error in str(err.value)


def test_two_profiles_need_a_handler():
    with pytest.raises(ConfigError) as err:
        load_config(f"plugins:\n- type: prefill-filter\n- type: decode-filter\n- type: queue-scorer\n{PD_PROFILES}")
    assert "disagg-profile-handler" in str(err.value)


def test_older_llm_d_pd_config_loads():
    """llm-d's deploy/config/pd-epp-config.yaml as of January 2026 (pd-profile-handler, no decider,
    the deprecated prefill-header-handler): every request gets a prefill pod when one is free."""
    sched = Scheduler.from_config(
        load_config(
            """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefill-header-handler
- type: prefix-cache-scorer
- type: prefill-filter
- type: decode-filter
- type: max-score-picker
- type: pd-profile-handler
schedulingProfiles:
- name: prefill
  plugins:
  - pluginRef: prefill-filter
  - pluginRef: max-score-picker
  - pluginRef: prefix-cache-scorer
    weight: 2
- name: decode
  plugins:
  - pluginRef: decode-filter
  - pluginRef: max-score-picker
  - pluginRef: prefix-cache-scorer
    weight: 2
"""
        )
    )
    assert isinstance(sched.handler, PdProfileHandler)
    eps = [Endpoint("p", labels={"llm-d.ai/role": "prefill"}), Endpoint("d", labels={"llm-d.ai/role": "decode"})]
    got = sched.schedule(request(prompt="hi"), eps)
    assert got.to_json() == {"primary_profile": "decode", "profiles": {"decode": ["d"], "prefill": ["p"]}}


@pytest.mark.parametrize("type_name", ["disagg-headers-handler", "prefill-header-handler"])
def test_deprecated_header_handlers_load_and_are_inert(type_name):
    cfg = load_config(f"plugins:\n- type: {type_name}\n  parameters: {{prefillProfile: p, encodeProfile: e}}\n")
    sched = Scheduler.from_config(cfg)
    assert sched.plugins[type_name].type_name == type_name
    req = request()
    sched.schedule(req, [Endpoint("d")])  # runs its pre_request
    assert req.headers == {}
    with pytest.raises(ConfigError):
        load_config(f"plugins:\n- type: {type_name}\n  parameters: {{prefillProfiles: p}}\n")
