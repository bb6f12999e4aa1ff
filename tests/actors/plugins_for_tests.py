"""Test-only plugins, imported by profile actors through ActorOptions.plugin_modules
(["tests.actors.plugins_for_tests"]; Ray workers find `tests` because pytest runs from the
repository root, which Ray puts on their sys.path).

* `test-sleep-filter` keeps every endpoint but takes `sleepMs`, so a profile run takes measurable
  time (to show two profile actors running at once).
* `test-learned-scorer` scores 1 for endpoints it was told (pre_request) have a request in flight
  and forgets them on response_complete: state that lives in the profile actor.
* `test-undeclared-hook-scorer` is the same, but has `response_complete` without declaring
  ResponseComplete: it is never called (a plugin gets the hooks of the roles it declares).
* `test-failing-hooks` keeps every endpoint; each of its lifecycle hooks raises (a plugin's bug).
* `test-request-view-recorder` declares the body fields `temperature` and `user` and writes what it
  sees of the request (`request_view`) onto every endpoint (so it comes back in the profile's
  result); what its PreRequest saw it keeps in `hook_views`.
* `test-undeclared-body-reader` declares `temperature` but reads `user` too."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

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


REQUEST_VIEW_KEY = "test-request-view"


def request_view(request: LLMRequest) -> dict[str, Any]:
    """All a plugin can see of a request, in plain values."""
    return {
        "request_id": request.request_id,
        "target_model": request.target_model,
        "body": dict(request.body),
        "reads": {f: request.body.get(f) for f in RequestViewRecorder.body_fields},
        "headers": dict(request.headers),
        "priority": request.priority,
        "received_at": request.received_at,
        "excluded_endpoints": sorted(request.excluded_endpoints),
    }


@register
class RequestViewRecorder(Scorer, PreRequest):
    type_name = "test-request-view-recorder"
    body_fields = frozenset({"temperature", "user"})

    def setup(self, handle: PluginHandle) -> None:
        self.hook_views: list[dict[str, Any]] = []

    def score(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> dict[Endpoint, float]:
        for ep in endpoints:
            cycle_state.set_endpoint_attribute(ep.name, REQUEST_VIEW_KEY, request_view(request))
        return dict.fromkeys(endpoints, 0.0)

    def pre_request(self, request: LLMRequest, result: SchedulingResult) -> None:
        self.hook_views.append(request_view(request))


@register
class UndeclaredBodyReader(Filter):
    type_name = "test-undeclared-body-reader"
    body_fields = frozenset({"temperature"})

    def filter(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        return endpoints if request.body.get("temperature") != request.body.get("user") else []
