"""single-profile-handler: GIE's profile/single_profile_handler_test.go cases."""

import pytest

from scheduler import ErrorCode, ProfileRunResult, SchedulerProfile, SchedulingError, SchedulingResult
from scheduler.plugins.handlers.single_profile import SingleProfileHandler
from scheduler.registry import plugin_class
from tests.scheduler.helpers import fresh_state, request

PROFILE = SchedulerProfile("default")
SUCCESS = ProfileRunResult([])


def test_type_and_name():
    assert plugin_class("single-profile-handler") is SingleProfileHandler
    assert SingleProfileHandler().name == "single-profile-handler"
    assert SingleProfileHandler(name="custom-name").name == "custom-name"
    assert SingleProfileHandler(name="custom-name").type_name == "single-profile-handler"


@pytest.mark.parametrize(
    ("profiles", "results", "want_count"),
    [
        pytest.param({"default": PROFILE}, {}, 1, id="no profiles executed yet, returns all"),
        pytest.param({"default": PROFILE}, {"default": ProfileRunResult([])}, 0, id="all executed, returns none"),
        pytest.param({"default": PROFILE}, {"default": None}, 0, id="executed and failed, returns none"),
        pytest.param({}, {}, 0, id="no profiles configured, returns none"),
    ],
)
def test_pick(profiles, results, want_count):
    got = SingleProfileHandler().pick(fresh_state(), request(), profiles, results)
    assert len(got) == want_count
    assert all(got[name] is profiles[name] for name in got)


def test_process_results_single_successful_profile():
    got = SingleProfileHandler().process_results(fresh_state(), request(), {"default": SUCCESS})
    assert got == SchedulingResult({"default": SUCCESS}, "default")


@pytest.mark.parametrize(
    ("results", "code"),
    [
        pytest.param({}, ErrorCode.INTERNAL, id="no profiles"),
        pytest.param({"profile-a": SUCCESS, "profile-b": SUCCESS}, ErrorCode.INTERNAL, id="multiple profiles"),
        pytest.param({"default": None}, ErrorCode.RESOURCE_EXHAUSTED, id="nil result (profile failed)"),
    ],
)
def test_process_results_errors(results, code):
    with pytest.raises(SchedulingError) as err:
        SingleProfileHandler().process_results(fresh_state(), request(), results)
    assert err.value.code is code


@pytest.mark.parametrize(("names", "ok"), [(["default"], True), (["a", "b"], False), ([], False)])
def test_validate_profiles(names, ok):
    assert (SingleProfileHandler().validate_profiles(names) == []) is ok
