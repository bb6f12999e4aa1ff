"""`all-profiles-handler`: GIE's first profile picker (PR #862 at 5bc74258, pkg/epp/scheduling/framework/
plugins/profile-picker/all_profiles_picker.go), which runs every profile in one round and
returns every result keyed by profile; the request fails only when every profile failed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field

from scheduler.cycle_state import CycleState
from scheduler.errors import ErrorCode, SchedulingError
from scheduler.interfaces import Parameters, ProfileHandler
from scheduler.registry import register
from scheduler.types import LLMRequest, ProfileRunResult, SchedulingResult


class AllProfilesParameters(Parameters):
    # The profile whose target is the primary destination; defaults to the first configured.
    primary_profile: str | None = Field(default=None, alias="primaryProfile")


@register
class AllProfilesHandler(ProfileHandler):
    type_name = "all-profiles-handler"
    Parameters = AllProfilesParameters

    def validate_profiles(self, profile_names: list[str]) -> list[str]:
        self._order = list(profile_names)
        primary = self.params.primary_profile
        if primary is not None and primary not in profile_names:
            return [f"parameters.primaryProfile: {primary!r} is not a configured profile {profile_names}"]
        return []

    def pick(
        self,
        cycle_state: CycleState,
        request: LLMRequest,
        profiles: Mapping[str, Any],
        results: Mapping[str, ProfileRunResult | None],
    ) -> dict[str, Any]:
        return {} if results else dict(profiles)

    def process_results(
        self, cycle_state: CycleState, request: LLMRequest, results: Mapping[str, ProfileRunResult | None]
    ) -> SchedulingResult:
        order = [n for n in getattr(self, "_order", []) if n in results] or list(results)
        primary = self.params.primary_profile
        if primary is None or results.get(primary) is None:
            primary = next((n for n in order if results[n] is not None), None)
        if primary is None:
            raise SchedulingError(ErrorCode.SERVICE_UNAVAILABLE, f"every scheduler profile failed: {order}")
        return SchedulingResult(profile_results=dict(results), primary_profile_name=primary)
