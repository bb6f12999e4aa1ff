"""`single-profile-handler`: run the one profile once; its failure fails the request (GIE's
single_profile_handler.go, pkg/epp/scheduling/framework/plugins/profile/ at e29fa4b2)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scheduler.cycle_state import CycleState, profile_failure
from scheduler.errors import ErrorCode, SchedulingError
from scheduler.interfaces import ProfileHandler
from scheduler.registry import register
from scheduler.types import LLMRequest, ProfileRunResult, SchedulingResult


@register
class SingleProfileHandler(ProfileHandler):
    type_name = "single-profile-handler"

    def validate_profiles(self, profile_names: list[str]) -> list[str]:
        if len(profile_names) != 1:
            return [f"needs exactly one scheduling profile, found {len(profile_names)}: {profile_names}"]
        return []

    def pick(
        self,
        cycle_state: CycleState,
        request: LLMRequest,
        profiles: Mapping[str, Any],
        results: Mapping[str, ProfileRunResult | None],
    ) -> dict[str, Any]:
        if len(profiles) == len(results):
            return {}
        return dict(profiles)

    def process_results(
        self, cycle_state: CycleState, request: LLMRequest, results: Mapping[str, ProfileRunResult | None]
    ) -> SchedulingResult:
        if len(results) != 1:
            raise SchedulingError(
                ErrorCode.INTERNAL, "single profile handler is intended to be used with a single profile"
            )
        name, result = next(iter(results.items()))
        if result is None:
            raise profile_failure(cycle_state, name)
        return SchedulingResult(profile_results=dict(results), primary_profile_name=name)
