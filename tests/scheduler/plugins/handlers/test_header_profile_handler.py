"""header-profile-handler: llm-d's cases (llm-d/llm-d-router pkg/epp/framework/plugins/scheduling/
profilehandler/headerprofile/header_profile_handler_test.go and its README) through a real scheduler."""

from __future__ import annotations

import pytest

from scheduler import Scheduler, SchedulingError
from scheduler.config import load_config
from scheduler.errors import ConfigError, ErrorCode
from tests.scheduler.helpers import endpoint, request

ROLES = ("encode", "prefill", "decode")
EPS = [endpoint(f"{r}-pod", {"llm-d.ai/role": r}) for r in ROLES]


def sched(params=None, roles=ROLES) -> Scheduler:
    return Scheduler.from_config(
        load_config(
            {
                "plugins": [
                    *({"type": f"{r}-filter"} for r in roles),
                    {"type": "header-profile-handler", "parameters": params or {}},
                ],
                "schedulingProfiles": [{"name": r, "plugins": [{"pluginRef": f"{r}-filter"}]} for r in roles],
            }
        )
    )


@pytest.mark.parametrize(
    ("params", "headers", "want"),
    [
        ({}, {"EPP-Profile": "prefill"}, "prefill"),
        ({}, {"epp-profile": "encode"}, "encode"),  # the header name is case-insensitive
        ({}, {}, "decode"),  # no header: defaultProfile
        ({}, {"EPP-Profile": "  "}, "decode"),  # blank: defaultProfile
        ({"headerName": "x-stage", "defaultProfile": "prefill"}, {}, "prefill"),
        ({"headerName": "x-stage"}, {"x-stage": "encode"}, "encode"),
    ],
)
def test_the_header_picks_the_one_profile(params, headers, want):
    result = sched(params).schedule(request(headers=headers), EPS)
    assert result.primary_profile_name == want and list(result.profile_results) == [want]
    assert result.profile_results[want].target_endpoints[0].name == f"{want}-pod"


def test_one_profile_always_runs_whatever_the_header():
    result = sched(roles=("prefill",)).schedule(request(headers={"EPP-Profile": "decode"}), EPS)
    assert result.primary_profile_name == "prefill"


def test_an_unconfigured_profile_is_a_bad_request_naming_the_header():
    with pytest.raises(SchedulingError) as err:
        sched().schedule(request(headers={"EPP-Profile": "nope"}), EPS)
    assert err.value.code is ErrorCode.BAD_REQUEST and "EPP-Profile" in str(err.value)


def test_a_default_profile_that_is_not_configured_is_a_config_error():
    with pytest.raises(ConfigError, match="defaultProfile 'decode' is not one of the profiles"):
        sched(roles=("encode", "prefill"))
