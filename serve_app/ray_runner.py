"""The ProfileRunner of the Ray path: the profiles of one round run at the same time, each in its
profile actor, with concurrent requests coalesced into one call per actor."""

from __future__ import annotations

import asyncio
from typing import Any

from actors.protocol import ProfileCall, ProfileEvent, ProfileOutcome
from scheduler import CycleState, Endpoint, ErrorCode, LLMRequest, ProfileRunResult, SchedulingError, SchedulingResult
from scheduler.cycle_state import profile_error_key
from scheduler.trace import SchedulingTrace
from serve_app.batcher import ActorBatcher


class RayProfileRunner:
    def __init__(self, profile_actors: dict[str, Any]) -> None:
        self.actors = profile_actors
        # One batcher per actor carries both the calls and the events (decisions, completions), so
        # a request costs one actor round trip, not three.
        self._batchers = {n: ActorBatcher(h.run_batch.remote) for n, h in profile_actors.items()}

    async def __call__(
        self,
        names: list[str],
        request: LLMRequest,
        cycle_state: CycleState,
        endpoints: list[Endpoint] | None,
        trace: SchedulingTrace | None,
    ) -> dict[str, ProfileRunResult | None]:
        call = ProfileCall(request, cycle_state, trace is not None)
        if len(names) == 1:
            outcomes = [await self._run_one(names[0], call)]
        else:  # the profiles of one round run at the same time, each in its own actor
            outcomes = await asyncio.gather(*(self._run_one(n, call) for n in names))
        results: dict[str, ProfileRunResult | None] = {}
        for name, outcome in zip(names, outcomes, strict=True):
            if outcome.error is not None:
                cycle_state.write(profile_error_key(name), outcome.error)
            if trace is not None and outcome.trace is not None:
                trace.profiles[name] = outcome.trace
            results[name] = outcome.result
        return results

    async def _run_one(self, name: str, call: ProfileCall) -> ProfileOutcome:
        try:
            return await self._batchers[name].call(call)
        except Exception as err:  # a dead or restarting profile actor fails this profile, not the gateway
            error = SchedulingError(ErrorCode.SERVICE_UNAVAILABLE, f"profile actor {name!r} unavailable: {err}")
            return ProfileOutcome(None, error, None, 0, 0.0, 0.0)

    def pre_request(self, request: LLMRequest, result: SchedulingResult) -> None:
        """Every profile actor learns the decision (its stateful plugins, e.g. the prefix index)."""
        event = ProfileEvent("pre_request", request, result=result)
        for batcher in self._batchers.values():
            batcher.notify(event)

    def response_complete(self, request: LLMRequest, endpoint_name: str) -> None:
        event = ProfileEvent("response_complete", request, endpoint_name=endpoint_name)
        for batcher in self._batchers.values():
            batcher.notify(event)
