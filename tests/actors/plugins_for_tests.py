"""Test-only plugins, imported by profile actors through ActorOptions.plugin_modules
(["tests.actors.plugins_for_tests"]; Ray workers find `tests` because pytest runs from the
repository root, which Ray puts on their sys.path).

* `test-sleep-filter` keeps every endpoint but takes `sleepMs`, so a profile run takes measurable
  time (to show two profile actors running at once).
* `test-learned-scorer` scores 1 for endpoints it was told (pre_request) have a request in flight
  and forgets them on response_complete: state that lives in the profile actor."""

from __future__ import annotations

import time
from collections import Counter

from pydantic import Field

from scheduler import CycleState, Endpoint, Filter, LLMRequest, Parameters, PreRequest, Scorer, register
from scheduler.types import SchedulingResult


class SleepParameters(Parameters):
    sleep_ms: float = Field(default=20.0, alias="sleepMs", ge=0)


@register
class SleepFilter(Filter):
    type_name = "test-sleep-filter"
    Parameters = SleepParameters

    def filter(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        time.sleep(self.params.sleep_ms / 1000.0)
        return endpoints


@register
class LearnedScorer(Scorer, PreRequest):
    type_name = "test-learned-scorer"

    def setup(self, handle) -> None:
        self.in_flight: Counter[str] = Counter()

    def score(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> dict[Endpoint, float]:
        return {ep: 1.0 if self.in_flight[ep.name] > 0 else 0.0 for ep in endpoints}

    def pre_request(self, request: LLMRequest, result: SchedulingResult) -> None:
        for profile_result in result.profile_results.values():
            for ep in profile_result.target_endpoints if profile_result else []:
                self.in_flight[ep.name] += 1

    def response_complete(self, request: LLMRequest, endpoint_name: str) -> None:
        self.in_flight[endpoint_name] -= 1
