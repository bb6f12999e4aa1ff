"""decision-tree-filter: the filter-chain semantics of GIE's original filter.go (filter.Filter and
TestFilter, at a70d66e5) and GIE's DecisionTreeFilterFactory cases (filter_test.go), through load_config."""

import json

import pytest

from scheduler import ConfigError, Scheduler, load_config
from scheduler.cycle_state import FILTER_FAILURE_KEY
from scheduler.errors import ErrorCode, SchedulingError
from scheduler.interfaces import PluginHandle
from scheduler.plugins.filters.decision_tree import DecisionTreeFilter, DecisionTreeParameters
from scheduler.registry import plugin_class
from tests.scheduler.fakes import FakePlugin
from tests.scheduler.helpers import endpoint, fresh_state, names, request

PODS = [endpoint(f"pod{i}") for i in (1, 2, 3, 4)]


class Keep(FakePlugin):
    """A filter keeping the named endpoints that records the names of the endpoints it was given."""

    def __init__(self, name, keep):
        super().__init__(name, keep=keep)
        self.seen: list[list[str]] = []

    def filter(self, cycle_state, request, endpoints):
        self.seen.append(names(endpoints))
        return super().filter(cycle_state, request, endpoints)


def tree(parameters, plugins):
    """A decision-tree-filter over the given plugin instances (a handle like the config builder's)."""
    by_name = {p.name: p for p in plugins}

    def resolve(name):
        return by_name[name]

    return DecisionTreeFilter(
        "tree", DecisionTreeParameters.model_validate(parameters), PluginHandle(resolve, list(by_name))
    )


def test_type_name():
    assert plugin_class("decision-tree-filter") is DecisionTreeFilter


# Filters: "some" keeps pod1 and pod2, "none" keeps nothing, "one" keeps pod3 (pod1 when given only those).
SEMANTICS = [
    pytest.param({"current": "some"}, ["pod1", "pod2"], {"some": [["pod1", "pod2", "pod3", "pod4"]]}, id="no next"),
    pytest.param({"current": "none"}, [], {"none": [["pod1", "pod2", "pod3", "pod4"]]}, id="no next, failure"),
    pytest.param(
        {"current": "some", "nextOnSuccess": "first"},
        ["pod1"],
        {"first": [["pod1", "pod2"]]},
        id="success continues with the kept endpoints",
    ),
    pytest.param(
        {"current": "none", "nextOnFailure": "one"},
        ["pod3"],
        {"one": [["pod1", "pod2", "pod3", "pod4"]]},
        id="failure continues with the original input",
    ),
    pytest.param(
        {"current": "none", "nextOnSuccess": "one"},
        [],
        {"one": []},
        id="failure without nextOnFailure returns the empty result",
    ),
    pytest.param(
        {"current": "some", "nextOnFailure": "one"},
        ["pod1", "pod2"],
        {"one": []},
        id="success without nextOnSuccess returns the kept endpoints",
    ),
    pytest.param(
        {"current": "some", "nextOnSuccessOrFailure": "first"},
        ["pod1"],
        {"first": [["pod1", "pod2"]]},
        id="nextOnSuccessOrFailure on success",
    ),
    pytest.param(
        {"current": "none", "nextOnSuccessOrFailure": "one"},
        ["pod3"],
        {"one": [["pod1", "pod2", "pod3", "pod4"]]},
        id="nextOnSuccessOrFailure on failure",
    ),
    pytest.param(
        {"current": "some", "nextOnSuccess": "first", "nextOnSuccessOrFailure": "one"},
        ["pod1"],
        {"first": [["pod1", "pod2"]], "one": []},
        id="nextOnSuccess wins over nextOnSuccessOrFailure",
    ),
    pytest.param(
        {"current": "none", "nextOnSuccess": "first", "nextOnSuccessOrFailure": "one"},
        ["pod3"],
        {"first": [], "one": [["pod1", "pod2", "pod3", "pod4"]]},
        id="nextOnSuccessOrFailure stands in for a missing nextOnFailure",
    ),
    pytest.param(
        {"current": "none", "nextOnFailure": "first", "nextOnSuccessOrFailure": "one"},
        ["pod1"],
        {"first": [["pod1", "pod2", "pod3", "pod4"]], "one": []},
        id="nextOnFailure wins over nextOnSuccessOrFailure",
    ),
    pytest.param(
        {
            "current": "some",
            "nextOnSuccess": {"decisionTree": {"current": "one", "nextOnFailure": "first"}},
        },
        ["pod1"],
        {"one": [["pod1", "pod2"]], "first": [["pod1", "pod2"]]},
        id="nested: a failure inside a branch restarts from the branch's input",
    ),
]


@pytest.mark.parametrize(("params", "want", "seen"), SEMANTICS)
def test_semantics(params, want, seen):
    plugins = {
        "some": Keep("some", ["pod1", "pod2"]),
        "none": Keep("none", []),
        "one": Keep("one", ["pod3"]),
        "first": Keep("first", ["pod1"]),
    }
    got = tree(params, plugins.values()).filter(fresh_state(), request(), PODS)
    assert names(got) == want
    for name, calls in seen.items():
        assert plugins[name].seen == calls, name


def test_long_form_and_shorthands_build_the_same_tree():
    plugins = [Keep(n, []) for n in ("a", "b", "c", "d")]
    long_form = {
        "current": {"pluginRef": "a"},
        "nextOnSuccess": {"decisionTree": {"current": {"pluginRef": "b"}, "nextOnFailure": {"pluginRef": "c"}}},
        "nextOnSuccessOrFailure": {"pluginRef": "d"},
    }
    short_form = {
        "current": "a",
        "nextOnSuccess": {"pluginRef": "b", "nextOnFailure": "c"},
        "nextOnSuccessOrFailure": "d",
    }
    want = {
        "current": "a",
        "onSuccess": {"current": "b", "onSuccess": None, "onFailure": "c"},
        "onFailure": "d",
    }
    assert tree(long_form, plugins).describe() == want
    assert tree(short_form, plugins).describe() == want


BASE_PLUGINS = [
    {"name": "leastKvCache", "type": "least-kv-cache-filter"},
    {"name": "leastQueue", "type": "least-queue-filter"},
    {"name": "loraAffinity", "type": "lora-affinity-filter"},
    {"name": "lowQueue", "type": "low-queue-filter"},
    {"name": "kvCacheScorer", "type": "kv-cache-utilization-scorer"},
]


def config(parameters) -> str:
    return json.dumps(
        {
            "apiVersion": "inference.networking.x-k8s.io/v1alpha1",
            "kind": "EndpointPickerConfig",
            "plugins": [*BASE_PLUGINS, {"name": "testing", "type": "decision-tree-filter", "parameters": parameters}],
            "schedulingProfiles": [{"name": "default", "plugins": [{"pluginRef": "testing"}]}],
        }
    )


def test_factory_success():
    """GIE's decisionTreeParametersSuccess."""
    params = {
        "current": {"pluginRef": "lowQueue"},
        "nextOnSuccess": {
            "decisionTree": {
                "current": {"pluginRef": "loraAffinity"},
                "nextOnSuccessOrFailure": {
                    "decisionTree": {
                        "current": {"pluginRef": "leastQueue"},
                        "nextOnSuccessOrFailure": {"decisionTree": {"current": {"pluginRef": "leastKvCache"}}},
                    }
                },
            }
        },
        "nextOnFailure": {
            "decisionTree": {
                "current": {"pluginRef": "leastQueue"},
                "nextOnSuccessOrFailure": {
                    "decisionTree": {
                        "current": {"pluginRef": "loraAffinity"},
                        "nextOnSuccessOrFailure": {"decisionTree": {"current": {"pluginRef": "leastKvCache"}}},
                    }
                },
            }
        },
    }
    sched = Scheduler.from_config(load_config(config(params)))
    leaf = {"current": "leastKvCache", "onSuccess": None, "onFailure": None}

    def chain(first, second):
        inner = {"current": second, "onSuccess": leaf, "onFailure": leaf}
        return {"current": first, "onSuccess": inner, "onFailure": inner}

    assert sched.plugins["testing"].describe() == {
        "current": "lowQueue",
        "onSuccess": chain("loraAffinity", "leastQueue"),
        "onFailure": chain("leastQueue", "loraAffinity"),
    }
    # the sub-filters are the configured instances, shared with anything else that names them
    assert sched.profiles["default"].filters == [sched.plugins["testing"]]


@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        pytest.param(
            {"current": {"pluginRef": "lowQueue", "decisionTree": {"current": {"pluginRef": "leastKvCache"}}}},
            "both pluginRef and decisionTree",
            id="bothError",
        ),
        pytest.param({"current": {}}, "either pluginRef or decisionTree", id="noneError"),
        pytest.param(
            {"current": {"pluginRef": "plover"}}, "'plover' is a reference to an undefined plugin", id="badPlugin"
        ),
        pytest.param({"current": {"pluginRef": "kvCacheScorer"}}, "is not a filter", id="notFilter"),
        pytest.param({"nextOnSuccess": {"pluginRef": "lowQueue"}}, "current", id="noCurrent"),
        pytest.param(
            {"current": {"pluginRef": "lowQueue"}, "nextOnSuccess": {"pluginRef": "kvCacheScorer"}},
            "parameters.nextOnSuccess.pluginRef: 'kvCacheScorer' (type kv-cache-utilization-scorer) is not a filter",
            id="badNextOnSuccess",
        ),
        pytest.param(
            {"current": {"pluginRef": "lowQueue"}, "nextOnFailure": {"pluginRef": "kvCacheScorer"}},
            "parameters.nextOnFailure.pluginRef",
            id="badNextOnFailure",
        ),
        pytest.param(
            {"current": {"pluginRef": "lowQueue"}, "nextOnSuccessOrFailure": {"pluginRef": "kvCacheScorer"}},
            "parameters.nextOnSuccessOrFailure.pluginRef",
            id="badNextOnSuccessOrFailure",
        ),
        pytest.param(
            {
                "current": "lowQueue",
                "nextOnFailure": {"decisionTree": {"current": "lowQueue", "nextOnFailure": "nope"}},
            },
            "parameters.nextOnFailure.decisionTree.nextOnFailure.pluginRef: 'nope'",
            id="bad reference deep in the tree names its path",
        ),
        pytest.param(
            {"current": {"decisionTree": {"current": "lowQueue"}, "nextOnSuccess": "leastQueue"}},
            "go inside the decisionTree",
            id="branches beside a decisionTree",
        ),
        pytest.param({"current": "lowQueue", "NextOnSuccess": "leastQueue"}, "unknown parameter", id="wrong case"),
        pytest.param({"current": "testing"}, "cycle", id="a tree that contains itself"),
    ],
)
def test_factory_errors(params, fragment):
    with pytest.raises(ConfigError) as info:
        load_config(config(params))
    text = str(info.value)
    assert "'testing'" in text and fragment in text, text


def test_built_without_config_is_an_error():
    with pytest.raises(ValueError, match="build it from a config"):
        DecisionTreeFilter("t", DecisionTreeParameters.model_validate({"current": "x"}))


class Dropper(FakePlugin):
    def filter(self, cycle_state, request, endpoints):
        cycle_state.write(FILTER_FAILURE_KEY, SchedulingError(ErrorCode.RESOURCE_EXHAUSTED, "dropped"))
        return []


def test_a_failure_handled_by_a_branch_is_forgotten():
    state = fresh_state()
    t = tree({"current": "drop", "nextOnFailure": "all"}, [Dropper("drop"), Keep("all", ["pod1"])])
    assert names(t.filter(state, request(), PODS)) == ["pod1"]
    assert FILTER_FAILURE_KEY not in state


def test_a_failure_recorded_before_the_tree_is_kept_when_a_branch_handles_another():
    state = fresh_state()
    earlier = SchedulingError(ErrorCode.NOT_FOUND, "earlier")
    state.write(FILTER_FAILURE_KEY, earlier)
    t = tree({"current": "drop", "nextOnFailure": "all"}, [Dropper("drop"), Keep("all", ["pod1"])])
    t.filter(state, request(), PODS)
    assert state.read(FILTER_FAILURE_KEY) is earlier


def test_a_failure_that_ends_the_tree_stays():
    state = fresh_state()
    t = tree({"current": "none", "nextOnFailure": "drop"}, [Keep("none", []), Dropper("drop")])
    assert t.filter(state, request(), PODS) == []
    assert state.read(FILTER_FAILURE_KEY).message == "dropped"
