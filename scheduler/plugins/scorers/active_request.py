"""`active-request-scorer` (llm-d): prefer endpoints with fewer requests in flight, counted from
this scheduler's own decisions rather than from scraped metrics.

PreRequest counts the request against the first target of every profile result; ResponseComplete
releases it; a request never released is dropped after `requestTimeout` (default 2m). An endpoint
with at most `idleThreshold` requests scores 1; a busier one scores
`(max - count) / max * maxBusyScore`, where `max` is the largest count over every tracked endpoint.
Counts are per plugin instance: in the Ray path, per profile actor."""

from __future__ import annotations

from typing import Annotated

from pydantic import BeforeValidator, Field

from scheduler.cycle_state import CycleState
from scheduler.duration import duration_seconds
from scheduler.interfaces import Parameters, PluginHandle, ResponseComplete, Scorer, ScorerCategory, TentativePreRequest
from scheduler.plugins.support.inflight_ledger import InFlightLedger, LedgerClock
from scheduler.registry import register
from scheduler.types import Endpoint, LLMRequest, SchedulingResult

Seconds = Annotated[float, BeforeValidator(duration_seconds)]


class ActiveRequestParameters(Parameters):
    # A Go duration string in config ("30s", "2m"); seconds once loaded.
    request_timeout: Seconds = Field(default=120.0, alias="requestTimeout", gt=0.0)
    idle_threshold: int = Field(default=0, alias="idleThreshold", ge=0)
    max_busy_score: float = Field(default=1.0, alias="maxBusyScore", ge=0.0, le=1.0)


@register
class ActiveRequestScorer(LedgerClock, Scorer, TentativePreRequest, ResponseComplete):
    type_name = "active-request-scorer"
    category = ScorerCategory.DISTRIBUTION
    Parameters = ActiveRequestParameters

    def setup(self, handle: PluginHandle) -> None:
        self.timeout = self.params.request_timeout
        self.ledger = InFlightLedger(self.timeout, handle.clock)

    def counts(self) -> dict[str, int]:
        """Requests in flight per endpoint name (endpoints with none are absent)."""
        return self.ledger.totals()

    def score(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> dict[Endpoint, float]:
        counts = self.counts()
        most = max(counts.values(), default=0)
        idle, busy_scale = self.params.idle_threshold, self.params.max_busy_score
        scores: dict[Endpoint, float] = {}
        for ep in endpoints:
            count = counts.get(ep.name, 0)
            scores[ep] = 1.0 if count <= idle else (most - count) / most * busy_scale
        return scores

    def pre_request(self, request: LLMRequest, result: SchedulingResult) -> None:
        names = [r.target_endpoints[0].name for r in result.profile_results.values() if r and r.target_endpoints]
        self.ledger.add(request.request_id, [(name, 1) for name in names])

    def withdraw(self, request: LLMRequest) -> None:
        self.ledger.release(request.request_id)

    def response_complete(self, request: LLMRequest, endpoint_name: str) -> None:
        self.ledger.release(request.request_id)
