"""EndpointPickerConfig loading: GIE's defaults and one clear error per mistake."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler import (
    ConfigError,
    PreRequest,
    ResponseComplete,
    Scheduler,
    Scorer,
    dump_config,
    load_config,
    load_config_file,
    register,
)
from scheduler.plugins.handlers.single_profile import SingleProfileHandler
from scheduler.plugins.pickers.max_score import MaxScorePicker

CONFIGS = Path(__file__).resolve().parents[2] / "ray_epp" / "configs"


def profile_refs(cfg, name):
    prof = next(p for p in cfg.scheduling_profiles if p.name == name)
    return [(r.plugin_ref, r.weight) for r in prof.plugins]


@pytest.mark.parametrize("api_version", ["inference.networking.x-k8s.io/v1alpha1", "llm-d.ai/v1alpha1"])
def test_both_api_versions_load(api_version):
    cfg = load_config(f"apiVersion: {api_version}\nkind: EndpointPickerConfig\nplugins:\n- type: queue-scorer\n")
    assert cfg.api_version == api_version


def test_defaults_one_profile_handler_picker_and_weight():
    cfg = load_config("plugins:\n- type: queue-scorer\n- type: kv-cache-utilization-scorer\n  name: kv\n")
    assert [p.name for p in cfg.scheduling_profiles] == ["default"]
    assert profile_refs(cfg, "default") == [("queue-scorer", 1.0), ("kv", 1.0), ("max-score-picker", None)]
    types = {p.name: p.type for p in cfg.plugins}
    assert types["single-profile-handler"] == "single-profile-handler"
    assert types["max-score-picker"] == "max-score-picker"
    sched = Scheduler.from_config(cfg)
    assert isinstance(sched.handler, SingleProfileHandler)
    assert isinstance(sched.profiles["default"].picker, MaxScorePicker)


def test_profile_without_picker_gets_the_configured_picker():
    cfg = load_config(
        """
plugins:
- type: queue-scorer
- {type: random-picker, name: rnd}
schedulingProfiles:
- name: p
  plugins: [{pluginRef: queue-scorer, weight: 5}]
"""
    )
    assert profile_refs(cfg, "p") == [("queue-scorer", 5.0), ("rnd", None)]
    assert not any(p.type == "max-score-picker" for p in cfg.plugins)


def test_plugin_shared_by_profiles_is_one_instance():
    cfg = load_config(
        """
plugins:
- type: queue-scorer
- type: all-profiles-handler
schedulingProfiles:
- {name: a, plugins: [{pluginRef: queue-scorer}]}
- {name: b, plugins: [{pluginRef: queue-scorer}]}
"""
    )
    sched = Scheduler.from_config(cfg)
    assert sched.profiles["a"].scorers[0].scorer is sched.profiles["b"].scorers[0].scorer


def test_validate_round_trip_is_stable():
    cfg = load_config_file(CONFIGS / "default.yaml")
    again = load_config(dump_config(cfg))
    assert dump_config(again) == dump_config(cfg)


BAD = [
    ("plugins:\n- type: no-such-scorer\n", ["plugins[0] 'no-such-scorer': unknown plugin type 'no-such-scorer'"]),
    (
        "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: x\n  plugins: [{pluginRef: missing}]\n",
        ["schedulingProfiles[0] 'x'.plugins[0]: pluginRef 'missing' names no plugin"],
    ),
    (
        "plugins:\n- type: max-score-picker\n  parameters: {maxNumOfEndpoints: many}\n",
        ["plugins[0] 'max-score-picker' (type max-score-picker): parameters.maxNumOfEndpoints"],
    ),
    (
        "plugins:\n- type: max-score-picker\n  parameters: {maxNumOfEndpointz: 2}\n",
        ["parameters.maxNumOfEndpointz: unknown parameter"],
    ),
    (
        "plugins:\n- type: queue-scorer\n- type: single-profile-handler\nschedulingProfiles:\n"
        "- name: x\n  plugins: [{pluginRef: single-profile-handler}]\n",
        ["plugin 'single-profile-handler' (type single-profile-handler) is not a producer, filter, scorer or picker"],
    ),
    (
        "plugins:\n- type: max-score-picker\n- type: random-picker\nschedulingProfiles:\n"
        "- name: x\n  plugins: [{pluginRef: max-score-picker}, {pluginRef: random-picker}]\n",
        ["a profile has one picker, found 2"],
    ),
    (
        "plugins:\n- type: max-score-picker\nschedulingProfiles:\n- name: x\n"
        "  plugins: [{pluginRef: max-score-picker, weight: 2}]\n",
        ["is not a scorer; only scorers take a weight"],
    ),
    (
        "plugins:\n- type: queue-scorer\n- type: single-profile-handler\nschedulingProfiles:\n"
        "- {name: a, plugins: [{pluginRef: queue-scorer}]}\n- {name: b, plugins: [{pluginRef: queue-scorer}]}\n",
        ["plugin 'single-profile-handler' (type single-profile-handler): needs exactly one scheduling profile"],
    ),
    (
        "plugins:\n- type: queue-scorer\nschedulingProfiles:\n"
        "- {name: a, plugins: [{pluginRef: queue-scorer}]}\n- {name: b, plugins: [{pluginRef: queue-scorer}]}\n",
        ["2 scheduling profiles need a profile handler"],
    ),
    ("plugins:\n- type: queue-scorer\n- type: queue-scorer\n", ["name 'queue-scorer' is used by more than one plugin"]),
    ("apiVersion: v2\n", ["apiVersion: Value error, apiVersion must be one of"]),
    ("plugins:\n- {type: queue-scorer, color: red}\n", ["plugins[0] 'queue-scorer'.color: unknown field"]),
    ("plugins: [\n", ["not valid YAML"]),
    ("- just\n- a list\n", ["must be a YAML mapping"]),
    (
        "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: x\n"
        "  plugins: [{pluginRef: queue-scorer, weight: -1}]\n",
        ["weight: Value error, weight must be >= 0"],
    ),
]


@pytest.mark.parametrize(("text", "expected"), BAD, ids=[e[0] for _, e in BAD])
def test_config_errors_name_plugin_and_field(text, expected):
    with pytest.raises(ConfigError) as info:
        load_config(text)
    message = str(info.value)
    for fragment in expected:
        assert fragment in message
    assert "Traceback" not in message


def test_a_missing_file_is_a_config_error_naming_the_path(tmp_path):
    with pytest.raises(ConfigError, match=f"no file at '{tmp_path / 'nope.yaml'}'"):
        load_config_file(tmp_path / "nope.yaml")


def test_an_unreadable_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="can not read config file"):
        load_config_file(tmp_path)  # a folder


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_load(path):
    cfg = load_config_file(path)
    Scheduler.from_config(cfg)


# A plugin class that declares a role and misses its method: registered (as a plugin module would
# be) but not buildable. The config naming it must fail at load, not on the first request.
@register
class ScorerWithoutScore(Scorer, PreRequest):
    type_name = "test-scorer-without-score"

    def pre_request(self, request, result) -> None:
        pass


@register
class HookWithoutMethod(Scorer, ResponseComplete):
    type_name = "test-hook-without-method"

    def score(self, cycle_state, request, endpoints):
        return {}


@pytest.mark.parametrize(
    ("type_name", "missing"),
    [("test-scorer-without-score", "score()"), ("test-hook-without-method", "response_complete()")],
)
def test_plugin_class_missing_a_role_method_fails_at_load(type_name, missing):
    with pytest.raises(ConfigError) as info:
        load_config(f"plugins:\n- name: mine\n  type: {type_name}\n")
    [line] = info.value.errors
    assert line.startswith(f"plugins[0] 'mine' (type {type_name}): ") and missing in line, line
