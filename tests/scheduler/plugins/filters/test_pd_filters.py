"""Role filters: llm-d's bylabel/roles_test.go (decode-filter, prefill-filter, encode-filter)."""

from __future__ import annotations

import pytest

from scheduler import ConfigError, Scheduler, load_config
from scheduler.plugins.filters.roles import ROLE_LABEL, DecodeFilter, EncodeFilter, PrefillFilter
from scheduler.registry import plugin_class
from tests.scheduler.helpers import endpoint, fresh_state, names, request

PODS = [
    endpoint("decode-pod", {ROLE_LABEL: "decode"}),
    endpoint("prefill-pod", {ROLE_LABEL: "prefill"}),
    endpoint("pd-pod", {ROLE_LABEL: "prefill-decode"}),
    endpoint("both-pod", {ROLE_LABEL: "both"}),
    endpoint("epd-pod", {ROLE_LABEL: "encode-prefill-decode"}),
    endpoint("encode-pod", {ROLE_LABEL: "encode"}),
    endpoint("ep-pod", {ROLE_LABEL: "encode-prefill"}),
    endpoint("no-label-pod", {"app": "vllm"}),
    endpoint("empty-labels-pod", {}),
    endpoint("empty-role-pod", {ROLE_LABEL: ""}),
    endpoint("unknown-role-pod", {ROLE_LABEL: "Decode"}),
    endpoint("other-key-pod", {"role": "decode"}),
]


@pytest.mark.parametrize(
    ("cls", "want"),
    [
        pytest.param(
            DecodeFilter,
            ["decode-pod", "pd-pod", "both-pod", "epd-pod", "no-label-pod", "empty-labels-pod", "other-key-pod"],
            id="decode",
        ),
        pytest.param(PrefillFilter, ["prefill-pod", "pd-pod", "both-pod", "epd-pod", "ep-pod"], id="prefill"),
        pytest.param(EncodeFilter, ["epd-pod", "encode-pod", "ep-pod"], id="encode"),
    ],
)
def test_role_filter(cls, want):
    assert names(cls().filter(fresh_state(), request(), PODS)) == want


@pytest.mark.parametrize("cls", [DecodeFilter, PrefillFilter, EncodeFilter])
def test_empty_endpoints(cls):
    assert cls().filter(fresh_state(), request(), []) == []


@pytest.mark.parametrize(
    ("type_name", "cls"),
    [("decode-filter", DecodeFilter), ("prefill-filter", PrefillFilter), ("encode-filter", EncodeFilter)],
)
def test_factory_and_name(type_name, cls):
    assert plugin_class(type_name) is cls
    assert cls().name == type_name
    assert cls(name="my-custom-name").name == "my-custom-name"
    sched = Scheduler.from_config(load_config(f"plugins:\n- type: {type_name}\n  name: test-{type_name}\n"))
    assert isinstance(sched.plugins[f"test-{type_name}"], cls)


def test_role_filters_take_no_parameters():
    with pytest.raises(ConfigError) as err:
        load_config("plugins:\n- type: prefill-filter\n  parameters: {label: role}\n")
    assert "parameters.label: unknown parameter" in str(err.value)
