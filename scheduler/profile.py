"""A scheduling profile: producers, filters in order, weighted scorers, one picker (GIE's
SchedulerProfile). The producers (in the order the config build resolved from their keys) write
the data the filters and scorers read, once per run, before the filters; one that raises is logged
(the first failure with its traceback, then one line per PRODUCER_LOG_EVERY) and skipped: its keys
are absent for that request and its consumers read "no data", as llm-d's Director logs a failed
producer and goes on.
The config's screeners (llm-d's request-control Screeners, outside any profile) narrow the pool
before each profile's filters: every profile sees the same screened pool, as in llm-d, where the
director screens once before scheduling."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from scheduler.cycle_state import FILTER_FAILURE_KEY, RUNNING_PROFILE, CycleState
from scheduler.errors import ErrorCode, SchedulingError
from scheduler.interfaces import Filter, Picker, PluginTimer, Producer, Scorer, Screener
from scheduler.trace import ProfileTrace
from scheduler.types import Endpoint, LLMRequest, ProfileRunResult, ScoredEndpoint

NO_ENDPOINTS = "no endpoints available for the given request"
PRODUCER_LOG_EVERY = 100  # a producer that keeps failing logs its 1st failure, then every 100th

log = logging.getLogger("ray_epp.scheduler.profile")


@dataclass(slots=True)
class WeightedScorer:
    scorer: Scorer
    weight: float


@dataclass(slots=True)
class SchedulerProfile:
    name: str
    filters: list[Filter] = field(default_factory=list)
    scorers: list[WeightedScorer] = field(default_factory=list)
    picker: Picker | None = None
    screeners: list[Screener] = field(default_factory=list)
    producers: list[Producer] = field(default_factory=list)
    producer_failures: dict[str, int] = field(default_factory=dict)  # producer name -> runs that raised

    def plugins(self) -> list:
        """Every plugin instance of the profile, in order, without repeats."""
        seen: dict[int, object] = {}
        for p in [*self.producers, *self.filters, *(ws.scorer for ws in self.scorers), self.picker]:
            if p is not None:
                seen.setdefault(id(p), p)
        return list(seen.values())

    def run(
        self,
        request: LLMRequest,
        cycle_state: CycleState,
        endpoints: list[Endpoint],
        trace: ProfileTrace | None = None,
        timer: PluginTimer | None = None,
    ) -> ProfileRunResult:
        """One cycle. Raises SchedulingError(Internal) when the filters leave no endpoint."""
        if self.picker is None:
            raise SchedulingError(ErrorCode.INTERNAL, f"profile {self.name!r} has no picker")
        if request.excluded_endpoints:
            endpoints = [ep for ep in endpoints if ep.name not in request.excluded_endpoints]
        for screener in self.screeners:
            start = time.perf_counter()
            kept = screener.screen(request, endpoints)
            endpoints = self._narrow(screener, "Screener", kept, endpoints, start, trace, timer)
        if self.producers:
            cycle_state.put(RUNNING_PROFILE, self.name)
        for producer in self.producers:
            start = time.perf_counter()
            produce_or_skip(producer, cycle_state, request, endpoints, self.producer_failures, f"profile {self.name!r}")
            if timer is not None:
                timer("Producer", producer, time.perf_counter() - start)
        candidates = self._filter(request, cycle_state, endpoints, trace, timer)
        if not candidates:
            err = cycle_state.read(FILTER_FAILURE_KEY)
            if not isinstance(err, SchedulingError):
                err = SchedulingError(ErrorCode.INTERNAL, NO_ENDPOINTS)
            cycle_state.delete(FILTER_FAILURE_KEY)
            raise err
        totals = self._score(request, cycle_state, candidates, trace, timer)
        scored = [ScoredEndpoint(ep, totals[ep]) for ep in candidates]
        start = time.perf_counter()
        result = self.picker.pick(cycle_state, scored)
        if timer is not None:
            timer("Picker", self.picker, time.perf_counter() - start)
        # Targets are copies carrying what plugins attached to them for this request.
        result.target_endpoints = [
            ep.with_attributes(attrs) if (attrs := cycle_state.endpoint_attributes(ep.name)) else ep
            for ep in result.target_endpoints
        ]
        if trace is not None:
            trace.totals = {ep.name: round(score, 6) for ep, score in totals.items()}
            trace.picked = [ep.name for ep in result.target_endpoints]
        return result

    def _filter(self, request, cycle_state, endpoints, trace, timer) -> list[Endpoint]:
        remaining = endpoints
        for f in self.filters:
            start = time.perf_counter()
            kept = f.filter(cycle_state, request, remaining)
            remaining = self._narrow(f, "Filter", kept, remaining, start, trace, timer)
            if not remaining:
                break
        return remaining

    @staticmethod
    def _narrow(plugin, point: str, kept, before, start: float, trace, timer) -> list[Endpoint]:
        """What a filter or screener kept of `before`, timed (from `start`) and traced."""
        if timer is not None:
            timer(point, plugin, time.perf_counter() - start)
        if trace is not None:
            kept_names = {ep.name for ep in kept}
            trace.filters.append(
                {
                    "plugin": plugin.name,
                    "type": plugin.type_name,
                    "removed": [ep.name for ep in before if ep.name not in kept_names],
                    "kept": [ep.name for ep in kept],
                }
            )
        return kept

    def _score(self, request, cycle_state, candidates, trace, timer) -> dict[Endpoint, float]:
        totals = dict.fromkeys(candidates, 0.0)
        for ws in self.scorers:
            start = time.perf_counter()
            scores = ws.scorer.score(cycle_state, request, candidates)
            if timer is not None:
                timer("Scorer", ws.scorer, time.perf_counter() - start)
            weight = ws.weight
            for ep, score in scores.items():
                if ep in totals:
                    totals[ep] += (0.0 if score < 0.0 else 1.0 if score > 1.0 else score) * weight
            if trace is not None:
                trace.scorers.append(
                    {
                        "plugin": ws.scorer.name,
                        "type": ws.scorer.type_name,
                        "weight": weight,
                        "scores": {ep.name: round(float(s), 6) for ep, s in scores.items()},
                    }
                )
        return totals


def produce_or_skip(
    producer: Producer,
    cycle_state: CycleState,
    request: LLMRequest,
    endpoints: list[Endpoint],
    failures: dict[str, int],
    where: str,
) -> None:
    """Run one producer: the one rule for a producer that raises, wherever producers run (a profile,
    the data preparation before the rounds). Its keys are then absent for this request (what it
    wrote before raising too) and the request goes on; `failures` counts it by producer name and
    the 1st failure is logged with its traceback, then one line per PRODUCER_LOG_EVERY."""
    try:
        producer.produce(cycle_state, request, endpoints)
    except Exception as err:  # a producer's failure costs its data, not the request
        for key in producer.produces:
            cycle_state.delete(key)
        n = failures[producer.name] = failures.get(producer.name, 0) + 1
        if n % PRODUCER_LOG_EVERY == 1:
            log.warning(
                "producer %r failed on request %s (%d failures in %s), scheduled without its data: %s: %s",
                producer.name, request.request_id, n, where, type(err).__name__, err, exc_info=n == 1,
            )  # fmt: skip
