"""`header-profile-handler` (llm-d's pkg/epp/framework/plugins/scheduling/profilehandler/headerprofile/
header_profile_handler.go): run exactly one profile per request, the one a request header names,
for a caller (llm-d's coordinator) that makes one scheduling call per stage.

One profile configured: it always runs. Several: the profile named by `headerName` (default
`EPP-Profile`, matched case-insensitively; the value matches a profile name exactly), or
`defaultProfile` (default `decode`) when the header is missing or blank. A value naming no
configured profile fails the request with 400 BadRequest naming the header; llm-d's scheduler can
only answer it 429, which its README calls misleading. A `defaultProfile` that is not configured
is a load-time error (llm-d leaves that to deployment)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field

from scheduler.cycle_state import CycleState, profile_failure
from scheduler.errors import ErrorCode, SchedulingError
from scheduler.interfaces import Parameters, ProfileHandler
from scheduler.registry import register
from scheduler.types import LLMRequest, ProfileRunResult, SchedulingResult


class HeaderProfileHandlerParameters(Parameters):
    header_name: str = Field(default="EPP-Profile", alias="headerName", min_length=1)
    default_profile: str = Field(default="decode", alias="defaultProfile", min_length=1)


@register
class HeaderProfileHandler(ProfileHandler):
    type_name = "header-profile-handler"
    Parameters = HeaderProfileHandlerParameters

    def validate_profiles(self, profile_names: list[str]) -> list[str]:
        if len(profile_names) > 1 and self.params.default_profile not in profile_names:
            return [f"defaultProfile {self.params.default_profile!r} is not one of the profiles {profile_names}"]
        return []

    def chosen(self, request: LLMRequest, profiles: Mapping[str, Any]) -> str:
        if len(profiles) == 1:
            return next(iter(profiles))
        value = request.header(self.params.header_name).strip()
        if not value:
            return self.params.default_profile
        if value not in profiles:
            raise SchedulingError(
                ErrorCode.BAD_REQUEST,
                f"header {self.params.header_name} names profile {value!r}, which is not one of {sorted(profiles)}",
            )
        return value

    def pick(
        self,
        cycle_state: CycleState,
        request: LLMRequest,
        profiles: Mapping[str, Any],
        results: Mapping[str, ProfileRunResult | None],
    ) -> dict[str, Any]:
        if results:
            return {}
        name = self.chosen(request, profiles)
        return {name: profiles[name]}

    def process_results(
        self, cycle_state: CycleState, request: LLMRequest, results: Mapping[str, ProfileRunResult | None]
    ) -> SchedulingResult:
        name, result = next(iter(results.items()))
        if result is None:
            raise profile_failure(cycle_state, name)
        return SchedulingResult(profile_results=dict(results), primary_profile_name=name)
