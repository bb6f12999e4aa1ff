"""Hypothesis strategies for hostile input: any JSON value, EndpointPickerConfig-like documents
built from the real plugin registry, pods lists, gateway settings and OpenAI-ish bodies.

Every fuzz test uses FUZZ (or a copy with fewer examples): derandomized, so a CI run repeats
exactly, no example database, and a per-example deadline that turns a slow input into a failure."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from scheduler import plugin_class, plugin_types

FUZZ = settings(
    derandomize=True,
    database=None,
    max_examples=300,
    # A hang, not jitter: the suite shares 2 cores with Ray, and one example took 3.8 s under load.
    deadline=timedelta(seconds=15),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)

HUGE_NUMBERS = st.sampled_from([10**30, -(10**30), 2**63, -(2**63) - 1, 1e308, -1e308, 10**400])
WEIRD_FLOATS = st.sampled_from([float("nan"), float("inf"), float("-inf"), -0.0, 5e-324])
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=40),
    HUGE_NUMBERS,
)
# Scalars that Python's json can write (it writes NaN / Infinity too, which json.loads reads back).
ANY_SCALAR = st.one_of(SCALARS, WEIRD_FLOATS)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=12), inner, max_size=5)),
    max_leaves=25,
)


def nested(depth: int, kind: str = "list") -> Any:
    """A value nested `depth` deep, built without recursion."""
    value: Any = 0
    for _ in range(depth):
        value = [value] if kind == "list" else {"a": value}
    return value


DEEP = st.builds(nested, st.sampled_from([10, 63, 64, 65, 200, 999, 1000, 1001, 5000, 100_000]),
                 st.sampled_from(["list", "dict"]))

# ---- EndpointPickerConfig-like documents ----------------------------------------------------

PLUGIN_TYPES = plugin_types()


def _field_keys(type_name: str) -> list[str]:
    fields = plugin_class(type_name).Parameters.model_fields
    return [k for name, f in fields.items() for k in (name, f.alias) if k]


@st.composite
def plugin_parameters(draw: st.DrawFn, type_name: str) -> Any:
    """Parameters for a real plugin type: its own field names (snake or camel case) with values
    right, wrong or absurd; sometimes an unknown key, sometimes not a mapping at all."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.one_of(ANY_SCALAR, st.lists(SCALARS, max_size=3)))
    keys = _field_keys(type_name) or ["x"]
    params = {}
    for key in draw(st.lists(st.sampled_from(keys), max_size=4, unique=True)):
        params[key] = draw(st.one_of(SCALARS, HUGE_NUMBERS, JSON_VALUES, DEEP))
    if draw(st.integers(0, 5)) == 0:
        params[draw(st.text(min_size=1, max_size=10))] = draw(SCALARS)
    return params


@st.composite
def plugin_specs(draw: st.DrawFn) -> Any:
    if draw(st.integers(0, 14)) == 0:
        return draw(JSON_VALUES)  # not a plugin spec at all
    type_name = draw(st.one_of(st.sampled_from(PLUGIN_TYPES), st.text(max_size=15), SCALARS)) \
        if draw(st.integers(0, 6)) == 0 else draw(st.sampled_from(PLUGIN_TYPES))
    spec: dict[str, Any] = {"type": type_name}
    if draw(st.booleans()):
        spec["name"] = draw(st.one_of(st.sampled_from(PLUGIN_TYPES), st.text(max_size=8), SCALARS))
    if draw(st.booleans()) and isinstance(type_name, str) and type_name in PLUGIN_TYPES:
        spec["parameters"] = draw(plugin_parameters(type_name))
    if draw(st.integers(0, 12)) == 0:
        del spec["type"]
    return spec


@st.composite
def profile_specs(draw: st.DrawFn, names: list[str]) -> Any:
    if draw(st.integers(0, 14)) == 0:
        return draw(JSON_VALUES)
    ref_names = st.one_of(st.sampled_from(names), st.text(max_size=8)) if names else st.text(max_size=8)
    refs = []
    for _ in range(draw(st.integers(0, 5))):
        ref: dict[str, Any] = {"pluginRef": draw(ref_names)}
        if draw(st.booleans()):
            ref["weight"] = draw(st.one_of(st.integers(-3, 10), st.floats(allow_nan=True), HUGE_NUMBERS, SCALARS))
        if draw(st.integers(0, 15)) == 0:
            ref = draw(JSON_VALUES)
        refs.append(ref)
    return {"name": draw(st.one_of(st.sampled_from(["default", "prefill", "decode"]), st.text(max_size=6))),
            "plugins": refs}


@st.composite
def config_documents(draw: st.DrawFn) -> Any:
    """An EndpointPickerConfig-like dict: mostly real plugin types with random parameters, plus
    dangling refs, duplicate names, missing or mistyped fields and unknown sections."""
    plugins = draw(st.lists(plugin_specs(), max_size=6))
    names = [p.get("name") or p.get("type") for p in plugins if isinstance(p, dict)]
    names = [n for n in names if isinstance(n, str)]
    doc: dict[str, Any] = {}
    if draw(st.booleans()):
        doc["apiVersion"] = draw(st.sampled_from(
            ["inference.networking.x-k8s.io/v1alpha1", "llm-d.ai/v1alpha1", "v2", ""]))
    if draw(st.booleans()):
        doc["kind"] = draw(st.sampled_from(["EndpointPickerConfig", "Pod", ""]))
    doc["plugins"] = plugins if draw(st.integers(0, 15)) else draw(JSON_VALUES)
    if draw(st.booleans()):
        doc["schedulingProfiles"] = draw(st.lists(profile_specs(names), max_size=3))
    sections = ("saturationDetector", "featureGates", "dataLayer", "flowControl", "requestHandler", "parser", "bogus")
    for section in sections:
        if draw(st.integers(0, 10)) == 0:
            doc[section] = draw(JSON_VALUES)
    if draw(st.integers(0, 20)) == 0:
        doc.pop("plugins")
    return doc


# ---- Pods files and gateway settings --------------------------------------------------------

POD_ENTRY = st.fixed_dictionaries(
    {},
    optional={
        "name": st.one_of(st.text(max_size=8), SCALARS),
        "address": st.one_of(st.sampled_from(["127.0.0.1", "pod.local", "::1", ""]), SCALARS),
        "port": st.one_of(st.integers(-5, 70_000), SCALARS),
        "labels": st.one_of(st.dictionaries(st.text(max_size=6), st.one_of(st.text(max_size=6), SCALARS),
                                            max_size=3), JSON_VALUES),
        "bogus": SCALARS,
    },
)
PODS_DOCUMENTS = st.one_of(
    st.lists(st.one_of(POD_ENTRY, JSON_VALUES), max_size=5),
    st.fixed_dictionaries({"pods": st.one_of(st.lists(POD_ENTRY, max_size=4), JSON_VALUES)}),
    JSON_VALUES,
    DEEP,
)

SETTINGS_KEYS = [
    "objectives", "max_body_bytes", "max_json_depth", "max_header_bytes", "body_read_timeout_s",
    "max_in_flight", "priority_range", "api_key", "reject_unknown_models", "max_retries",
    "upstream_timeout_s", "connect_timeout_s", "first_byte_timeout_s", "stream_idle_timeout_s", "keep_alive_timeout_s",
    "saturation_queue_depth", "saturation_kv_cache", "metrics_staleness_s", "debug_header",
    "debug_token", "debug_trace", "pick_api", "pd_mode", "pd_prefill_retries", "pd_prefill_failure", "bogus",
]
SETTINGS_DOCUMENTS = st.one_of(
    st.dictionaries(st.sampled_from(SETTINGS_KEYS), st.one_of(SCALARS, JSON_VALUES, HUGE_NUMBERS), max_size=6),
    JSON_VALUES,
    DEEP,
)

# ---- OpenAI-ish request bodies --------------------------------------------------------------

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
FIELD_VALUES = st.one_of(SCALARS, JSON_VALUES, DEEP, HUGE_NUMBERS, WEIRD_FLOATS,
                         st.text(min_size=1000, max_size=3000))
MESSAGES = st.one_of(
    st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "tool", ""]),
                                     "content": st.one_of(st.text(max_size=50), FIELD_VALUES)}),
             min_size=1, max_size=4),
    FIELD_VALUES,
)
OPENAI_KEYS = ["model", "prompt", "messages", "stream", "max_tokens", "temperature", "n", "stop",
               "logprobs", "user", "extra", "stream_options", "tools", "kv_transfer_params"]


@st.composite
def openai_bodies(draw: st.DrawFn) -> Any:
    """A body that is mostly an OpenAI request with some fields wrong (type, size, depth)."""
    body: dict[str, Any] = {"model": draw(st.one_of(st.just(MODEL), FIELD_VALUES))}
    if draw(st.booleans()):
        body["prompt"] = draw(st.one_of(st.text(max_size=200), st.lists(st.integers(0, 50_000), max_size=20),
                                        st.lists(st.text(max_size=20), max_size=3), FIELD_VALUES))
    else:
        body["messages"] = draw(MESSAGES)
    for key in draw(st.lists(st.sampled_from(OPENAI_KEYS), max_size=4, unique=True)):
        body[key] = draw(FIELD_VALUES)
    if draw(st.integers(0, 10)) == 0:
        body.pop(draw(st.sampled_from(sorted(body))))
    return body


def dumps(value: Any) -> bytes:
    """JSON text for any value, however deep (json.dumps recurses, so this walks with a stack)."""
    out: list[str] = []
    stack: list[Any] = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, _Raw):
            out.append(node.text)
        elif isinstance(node, list):
            stack.append(_Raw("]"))
            for i, item in enumerate(reversed(node)):
                stack.append(item)
                if i < len(node) - 1:
                    stack.append(_Raw(","))
            out.append("[")
        elif isinstance(node, dict):
            stack.append(_Raw("}"))
            items = list(node.items())
            for i, (key, item) in enumerate(reversed(items)):
                stack.append(item)
                stack.append(_Raw(json.dumps(str(key)) + ":"))
                if i < len(items) - 1:
                    stack.append(_Raw(","))
            out.append("{")
        else:
            out.append(json.dumps(node))
    return "".join(out).encode()


class _Raw:
    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


RAW_BODIES = st.one_of(
    openai_bodies().map(dumps),
    JSON_VALUES.map(dumps),
    DEEP.map(dumps),
    st.binary(max_size=200),  # mostly invalid UTF-8 / not JSON
    st.sampled_from([b"", b"{", b"\xff\xfe{}", b'{"model": "\xff"}', b"[" * 200_000, b"{" * 50_000,
                     b'{"model": "m", "prompt": "' + b"\xc3\x28" * 100 + b'"}', b"NaN", b"1e99999",
                     b'{"model": "m", "prompt": 1, "a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"]),
    st.builds(lambda n: b'{"model": "%s", "prompt": "%s"}' % (MODEL.encode(), b"x" * n),
              st.sampled_from([10, 100_000, 999_000, 2_000_000])),
)
