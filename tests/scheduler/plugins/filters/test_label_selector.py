"""label-selector-filter and by-label: llm-d's bylabel/selector_test.go and filter_test.go cases,
through load_config so parameter errors are load-time errors."""

import pytest

from scheduler import ConfigError, Scheduler, load_config
from scheduler.plugins.filters.by_label import ByLabelFilter
from scheduler.plugins.filters.label_selector import LabelSelectorFilter
from scheduler.registry import plugin_class
from tests.scheduler.helpers import endpoint, fresh_state, names, request


def config(type_name: str, parameters) -> str:
    import json

    return json.dumps(
        {
            "apiVersion": "inference.networking.x-k8s.io/v1alpha1",
            "kind": "EndpointPickerConfig",
            "plugins": [{"name": "f", "type": type_name, "parameters": parameters}],
        }
    )


def build(type_name: str, parameters):
    return Scheduler.from_config(load_config(config(type_name, parameters))).plugins["f"]


ENDPOINTS = [
    endpoint("nginx-1", {"app": "nginx", "version": "v1.0", "tier": "frontend"}),
    endpoint("nginx-2", {"app": "nginx", "version": "v1.1", "tier": "frontend"}),
    endpoint("coredns-1", {"app": "coredns", "tier": "system"}),
    endpoint("redis-1", {"app": "redis", "tier": "backend", "deprecated": "true"}),
    endpoint("web-1", {"app": "web", "tier": "frontend", "environment": "production"}),
]


def test_type_names():
    assert plugin_class("label-selector-filter") is LabelSelectorFilter
    assert plugin_class("by-label-selector") is LabelSelectorFilter  # llm-d's deprecated name
    assert plugin_class("by-label") is ByLabelFilter


@pytest.mark.parametrize(
    ("selector", "want"),
    [
        pytest.param({"matchLabels": {"app": "nginx"}}, ["nginx-1", "nginx-2"], id="matchLabels - app nginx"),
        pytest.param({"matchLabels": {"app": "nginx", "version": "v1.0"}}, ["nginx-1"], id="matchLabels - exact"),
        pytest.param(
            {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["frontend", "backend"]}]},
            ["nginx-1", "nginx-2", "redis-1", "web-1"],
            id="In",
        ),
        pytest.param(
            {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["system"]}]},
            ["nginx-1", "nginx-2", "redis-1", "web-1"],
            id="NotIn",
        ),
        pytest.param(
            {"matchExpressions": [{"key": "environment", "operator": "NotIn", "values": ["production"]}]},
            ["nginx-1", "nginx-2", "coredns-1", "redis-1"],
            id="NotIn matches endpoints without the label",
        ),
        pytest.param({"matchExpressions": [{"key": "deprecated", "operator": "Exists"}]}, ["redis-1"], id="Exists"),
        pytest.param(
            {"matchExpressions": [{"key": "deprecated", "operator": "DoesNotExist"}]},
            ["nginx-1", "nginx-2", "coredns-1", "web-1"],
            id="DoesNotExist",
        ),
        pytest.param(
            {
                "matchLabels": {"tier": "frontend"},
                "matchExpressions": [{"key": "environment", "operator": "Exists"}],
            },
            ["web-1"],
            id="matchLabels and matchExpressions together (AND)",
        ),
        pytest.param(
            {
                "matchExpressions": [
                    {"key": "tier", "operator": "In", "values": ["frontend"]},
                    {"key": "version", "operator": "NotIn", "values": ["v1.0"]},
                ]
            },
            ["nginx-2", "web-1"],
            id="expressions are ANDed",
        ),
        pytest.param({}, [e.name for e in ENDPOINTS], id="empty selector matches all"),
        pytest.param(None, [e.name for e in ENDPOINTS], id="no parameters matches all"),
        pytest.param({"matchLabels": {"app": "nonexistent"}}, [], id="no matches"),
    ],
)
def test_label_selector_filtering(selector, want):
    f = build("label-selector-filter", selector)
    assert sorted(names(f.filter(fresh_state(), request(), ENDPOINTS))) == sorted(want)


def test_label_selector_edge_cases():
    f = build("label-selector-filter", {"matchLabels": {"app": "test"}})
    assert f.filter(fresh_state(), request(), []) == []
    assert f.filter(fresh_state(), request(), [endpoint("pod-1", {})]) == []


def test_deprecated_name_filters_the_same():
    f = build("by-label-selector", {"matchLabels": {"app": "nginx"}})
    assert names(f.filter(fresh_state(), request(), ENDPOINTS)) == ["nginx-1", "nginx-2"]


def test_leaderworkerset_roles():
    """llm-d's example: decode on the LWS leader, prefill where there is no worker index."""
    pod = [endpoint("vllm", {"app.kubernetes.io/name": "m", "leaderworkerset.sigs.k8s.io/worker-index": "0"})]
    key = "leaderworkerset.sigs.k8s.io/worker-index"
    leader = build("label-selector-filter", {"matchLabels": {key: "0"}})
    follower = build(
        "label-selector-filter", {"matchExpressions": [{"key": key, "operator": "NotIn", "values": ["0"]}]}
    )
    prefill = build("label-selector-filter", {"matchExpressions": [{"key": key, "operator": "DoesNotExist"}]})
    assert [bool(f.filter(fresh_state(), request(), pod)) for f in (leader, follower, prefill)] == [True, False, False]


@pytest.mark.parametrize(
    ("selector", "fragment"),
    [
        pytest.param(
            {"matchExpressions": [{"key": "app", "operator": "InvalidOperator", "values": ["nginx"]}]},
            "operator",
            id="invalid operator",
        ),
        pytest.param({"matchExpressions": [{"key": "app", "operator": "In"}]}, "non-empty", id="In without values"),
        pytest.param(
            {"matchExpressions": [{"key": "app", "operator": "Exists", "values": ["x"]}]},
            "takes no",
            id="Exists with values",
        ),
        pytest.param({"matchLabels": {"bad key!": "x"}}, "invalid label key", id="invalid key"),
        pytest.param({"matchLabels": {"app": "-bad"}}, "invalid label value", id="invalid value"),
        pytest.param({"matchLabels": {"Bad_Prefix/app": "x"}}, "DNS subdomain", id="invalid key prefix"),
        pytest.param({"matchLabel": {"app": "x"}}, "unknown parameter", id="unknown field"),
    ],
)
def test_label_selector_rejects_bad_selectors(selector, fragment):
    with pytest.raises(ConfigError) as info:
        load_config(config("label-selector-filter", selector))
    text = str(info.value)
    assert "'f'" in text and fragment in text


@pytest.mark.parametrize(
    ("params", "want"),
    [
        pytest.param(
            {"label": "llm-d.ai/role", "validValues": ["decode", "both"]},
            ["decode-pod", "both-pod"],
            id="valid values only",
        ),
        pytest.param(
            {"label": "llm-d.ai/role", "validValues": ["decode"], "allowsNoLabel": True},
            ["decode-pod", "no-role"],
            id="valid values and pods without the label",
        ),
        pytest.param({"label": "llm-d.ai/role", "allowsNoLabel": True}, ["no-role"], id="only pods without the label"),
    ],
)
def test_by_label(params, want):
    pods = [
        endpoint("prefill-pod", {"llm-d.ai/role": "prefill"}),
        endpoint("decode-pod", {"llm-d.ai/role": "decode"}),
        endpoint("both-pod", {"llm-d.ai/role": "both"}),
        endpoint("no-role", {}),
    ]
    assert names(build("by-label", params).filter(fresh_state(), request(), pods)) == want


@pytest.mark.parametrize(
    "params",
    [
        pytest.param({"validValues": ["a"]}, id="no label"),
        pytest.param({"label": "role"}, id="neither validValues nor allowsNoLabel"),
        pytest.param({"label": "role", "validValues": [], "allowsNoLabel": False}, id="empty validValues"),
    ],
)
def test_by_label_rejects_bad_parameters(params):
    with pytest.raises(ConfigError, match="'f'"):
        load_config(config("by-label", params))
