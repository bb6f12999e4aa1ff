"""`active-request-scorer` (llm-d): prefer endpoints with fewer requests in flight, counted from
this scheduler's own decisions rather than from scraped metrics.

PreRequest counts the request against the first target of every profile result; ResponseComplete
releases it; a request never released is dropped after `requestTimeout` (default 2m). An endpoint
with at most `idleThreshold` requests scores 1; a busier one scores
`(max - count) / max * maxBusyScore`, where `max` is the largest count over every tracked endpoint.
Counts are per plugin instance: in the Ray path, per profile actor."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Annotated

from pydantic import BeforeValidator, Field

from scheduler.cycle_state import CycleState
from scheduler.duration import duration_seconds
from scheduler.interfaces import Parameters, PreRequest, ResponseComplete, Scorer, ScorerCategory
from scheduler.registry import register
from scheduler.types import Endpoint, LLMRequest, SchedulingResult

Seconds = Annotated[float, BeforeValidator(duration_seconds)]


class ActiveRequestParameters(Parameters):
    # A Go duration string in config ("30s", "2m"); seconds once loaded.
    request_timeout: Seconds = Field(default=120.0, alias="requestTimeout", gt=0.0)
    idle_threshold: int = Field(default=0, alias="idleThreshold", ge=0)
    max_busy_score: float = Field(default=1.0, alias="maxBusyScore", ge=0.0, le=1.0)


@register
class ActiveRequestScorer(Scorer, PreRequest, ResponseComplete):
    type_name = "active-request-scorer"
    category = ScorerCategory.DISTRIBUTION
    Parameters = ActiveRequestParameters

    def setup(self, handle) -> None:
        self.timeout = self.params.request_timeout
        self.clock: Callable[[], float] = time.monotonic
        self._lock = threading.Lock()
        # request id -> (expiry time, endpoint names); one timeout for all, so oldest first.
        self._requests: OrderedDict[str, tuple[float, list[str]]] = OrderedDict()
        self._counts: dict[str, int] = {}

    def counts(self) -> dict[str, int]:
        """Requests in flight per endpoint name (endpoints with none are absent)."""
        with self._lock:
            self._expire()
            return dict(self._counts)

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
        with self._lock:
            self._expire()
            self._release(request.request_id)  # a request scheduled again is counted once
            self._requests[request.request_id] = (self.clock() + self.timeout, names)
            for name in names:
                self._counts[name] = self._counts.get(name, 0) + 1

    def response_complete(self, request: LLMRequest, endpoint_name: str) -> None:
        with self._lock:
            self._release(request.request_id)
            self._expire()

    def _release(self, request_id: str) -> None:
        entry = self._requests.pop(request_id, None)
        if entry is not None:
            self._decrement(entry[1])

    def _expire(self) -> None:
        now = self.clock()
        while self._requests:
            request_id, (expires, names) = next(iter(self._requests.items()))
            if expires > now:
                break
            del self._requests[request_id]
            self._decrement(names)

    def _decrement(self, names: list[str]) -> None:
        for name in names:
            count = self._counts.get(name, 0)
            if count <= 1:
                self._counts.pop(name, None)
            else:
                self._counts[name] = count - 1
