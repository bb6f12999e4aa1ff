"""all-profiles-handler (GIE PR #862's all-profiles picker): every profile in one round; the primary
is the configured one, else the first that succeeded; the request fails only when every profile
failed."""

import pytest

from scheduler import ConfigError, ErrorCode, ProfileRunResult, Scheduler, SchedulingError
from scheduler.plugins.handlers.all_profiles import AllProfilesHandler, AllProfilesParameters
from tests.scheduler.helpers import endpoint, fresh_state, request

OK = ProfileRunResult([endpoint("pod1")])


def handler(primary=None, order=("x", "y", "z")):
    h = AllProfilesHandler(params=AllProfilesParameters(primary_profile=primary))
    assert h.validate_profiles(list(order)) == []
    return h


def test_pick_runs_every_profile_once():
    h = handler()
    profiles = {"x": object(), "y": object()}
    assert h.pick(fresh_state(), request(), profiles, {}) == profiles
    assert h.pick(fresh_state(), request(), profiles, {"x": OK, "y": None}) == {}


@pytest.mark.parametrize(
    ("primary", "results", "want"),
    [
        pytest.param(None, {"x": OK, "y": OK}, "x", id="first configured by default"),
        pytest.param(None, {"y": OK, "x": None}, "y", id="first that succeeded"),
        pytest.param(None, {"z": OK, "x": OK}, "x", id="configured order, not result order"),
        pytest.param("y", {"x": OK, "y": OK}, "y", id="configured primary"),
        pytest.param("y", {"x": OK, "y": None}, "x", id="configured primary failed"),
    ],
)
def test_primary(primary, results, want):
    got = handler(primary).process_results(fresh_state(), request(), results)
    assert got.primary_profile_name == want
    assert got.profile_results == results  # failed profiles stay, as None


def test_every_profile_failed():
    with pytest.raises(SchedulingError) as err:
        handler().process_results(fresh_state(), request(), {"x": None, "y": None})
    assert err.value.code is ErrorCode.SERVICE_UNAVAILABLE


def test_unknown_primary_is_a_config_error():
    h = AllProfilesHandler(params=AllProfilesParameters(primary_profile="nope"))
    assert h.validate_profiles(["x"]) != []
    config = """
plugins:
- type: all-profiles-handler
  parameters: {primaryProfile: nope}
- type: queue-scorer
schedulingProfiles:
- name: x
  plugins: [{pluginRef: queue-scorer}]
"""
    with pytest.raises(ConfigError, match="nope"):
        Scheduler.from_config(config)


def test_end_to_end_with_a_failing_profile():
    config = """
plugins:
- type: all-profiles-handler
- type: queue-scorer
- name: only-b
  type: label-selector-filter
  parameters: {matchLabels: {role: b}}
schedulingProfiles:
- name: x
  plugins: [{pluginRef: only-b}, {pluginRef: queue-scorer}]
- name: y
  plugins: [{pluginRef: queue-scorer}]
"""
    result = Scheduler.from_config(config).schedule(request(), [endpoint("pod1", labels={"role": "a"})])
    assert result.to_json() == {"primary_profile": "y", "profiles": {"x": None, "y": ["pod1"]}}
