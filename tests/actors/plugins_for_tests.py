"""Test-only plugins, imported by profile actors through ActorOptions.plugin_modules
(["tests.actors.plugins_for_tests"]; Ray workers find `tests` because pytest runs from the
repository root, which Ray puts on their sys.path).

* `test-sleep-filter` keeps every endpoint but takes `sleepMs`, so a profile run takes measurable
  time (to show two profile actors running at once).
* `test-learned-scorer` scores 1 for endpoints it was told (pre_request) have a request in flight
  and forgets them on response_complete: state that lives in the profile actor.
* `test-undeclared-hook-scorer` is the same, but has `response_complete` without declaring
  ResponseComplete: it is never called (a plugin gets the hooks of the roles it declares).
* `test-failing-hooks` keeps every endpoint; each of its lifecycle hooks raises (a plugin's bug)."""

from __future__ import annotations

import time
from collections import Counter

from pydantic import Field

from scheduler import (
    CycleState,
    Endpoint,
    Filter,
    LLMRequest,
    Parameters,
    PluginHandle,
    PreRequest,
    ResponseComplete,
    ResponseFirstToken,
    Scorer,
    register,
)
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


class InFlightScorer(Scorer, PreRequest):
    """Scores 1 for endpoints it was told (pre_request) have a request in flight."""

    def setup(self, handle: PluginHandle) -> None:
        self.in_flight: Counter[str] = Counter()

    def score(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> dict[Endpoint, float]:
        return {ep: 1.0 if self.in_flight[ep.name] > 0 else 0.0 for ep in endpoints}

    def pre_request(self, request: LLMRequest, result: SchedulingResult) -> None:
        for profile_result in result.profile_results.values():
            for ep in profile_result.target_endpoints if profile_result else []:
                self.in_flight[ep.name] += 1

    def response_complete(self, request: LLMRequest, endpoint_name: str) -> None:
        self.in_flight[endpoint_name] -= 1


@register
class LearnedScorer(InFlightScorer, ResponseComplete):
    type_name = "test-learned-scorer"


@register
class UndeclaredHookScorer(InFlightScorer):
    type_name = "test-undeclared-hook-scorer"


@register
class FailingHooks(Filter, PreRequest, ResponseFirstToken, ResponseComplete):
    type_name = "test-failing-hooks"

    def filter(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        return endpoints

    def pre_request(self, request: LLMRequest, result: SchedulingResult) -> None:
        raise RuntimeError(f"{self.type_name}: pre_request")

    def response_first_token(self, request: LLMRequest, endpoint_name: str) -> None:
        raise RuntimeError(f"{self.type_name}: response_first_token")

    def response_complete(self, request: LLMRequest, endpoint_name: str) -> None:
        raise RuntimeError(f"{self.type_name}: response_complete")
