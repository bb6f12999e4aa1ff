"""`program-aware-fairness`: the flow of a band whose program has attained the least service goes
next (llm-d-router pkg/epp/framework/plugins/flowcontrol/fairness/program-aware, strategy `las`,
Least Attained Service). A program is a fairness id (the flow key header).

Each program's attained service is its served requests' weighted tokens, prompt + 2 * completion
(from each response's `usage`: `ResponseUsage`), decayed with the half-life `lasHalfLifeSeconds`
in wall-clock time (0: never). Among the band's non-empty flows, each scores
`lasWeightService * (1 - n(service)) + lasWeightHeadWait * n(head wait)`, n normalising over
those flows to [0, 1] (0.5 when they are all equal), and the highest goes next; a tie goes to the
first by fairness id (llm-d's is the map's order). A program with nothing queued and no completion
for `evictionTtlSeconds` is forgotten, swept at most every `evictionSweepSeconds`; llm-d also keeps
one with requests in flight, which the gateway's policy does not count (a completion after the
sweep starts the program again from what it then costs).

Its gauges, with llm-d's names (`gauges()`): Jain's fairness index over the programs' mean queue
waits, each program's mean wait (ms, a running mean over its dispatches, each measured when the
policy picks it) and its attained service as last written at a completion (llm-d's LAS strategy
writes it then, so an idle program's value holds). At most `MAX_PROGRAM_SERIES` programs get
series: program ids come from a client header.

The policy runs in each gateway replica's queue, so a replica ranks programs by the service of the
responses it relayed itself, as its queue holds only its own requests; its gauges are that
replica's."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field

from scheduler.flowcontrol.types import DEFAULT_FAIRNESS_ID, FAIRNESS_ID_HEADER, FlowQueue
from scheduler.interfaces import FairnessPolicy, Parameters, PluginHandle, ReportsGauges, ResponseUsage
from scheduler.registry import register
from scheduler.types import LLMRequest

INPUT_WEIGHT, OUTPUT_WEIGHT = 1, 2
MAX_PROGRAM_SERIES = 32
FAIRNESS_INDEX = "llm_d_epp_program_aware_jains_fairness_index"
AVG_WAIT_MS = "llm_d_epp_program_aware_avg_wait_time_milliseconds"
ATTAINED_SERVICE = "llm_d_epp_program_aware_attained_service_tokens"


class ProgramAwareParameters(Parameters):
    strategy: Literal["las"] = "las"
    las_weight_service: float = Field(0.8, alias="lasWeightService", ge=0.0)
    las_weight_head_wait: float = Field(0.2, alias="lasWeightHeadWait", ge=0.0)
    las_half_life_seconds: float = Field(60.0, alias="lasHalfLifeSeconds", ge=0.0)
    eviction_ttl_seconds: float = Field(3600.0, alias="evictionTtlSeconds", ge=0.0)
    eviction_sweep_seconds: float = Field(300.0, alias="evictionSweepSeconds", gt=0.0)


@dataclass(slots=True)
class _Program:
    service: float = 0.0
    anchor: float = math.nan  # when `service` was last decayed
    last_seen: float = 0.0  # its last completion, or last time it had a flow waiting
    waits: int = 0  # dispatches whose queue wait is in avg_wait_ms
    avg_wait_ms: float = 0.0
    reported_service: float | None = None  # the service its last completion left (the gauge)


def _normalise(value: float, low: float, high: float) -> float:
    return 0.5 if high == low else (value - low) / (high - low)


@register
class ProgramAwareFairness(FairnessPolicy, ResponseUsage, ReportsGauges):
    type_name = "program-aware-fairness"
    Parameters = ProgramAwareParameters

    def setup(self, handle: PluginHandle) -> None:
        self.clock: Callable[[], float] = handle.clock
        self.programs: dict[str, _Program] = {}
        self._swept = -math.inf

    def service(self, program_id: str) -> float:
        """The program's attained service now (weighted tokens, decayed)."""
        return self._decayed(self._program(program_id), self.clock())

    def _program(self, program_id: str) -> _Program:
        state = self.programs.get(program_id)
        if state is None:
            state = self.programs[program_id] = _Program(last_seen=self.clock())
        return state

    def _decayed(self, state: _Program, now: float) -> float:
        half_life = self.params.las_half_life_seconds
        if not math.isnan(state.anchor) and half_life > 0 and now > state.anchor:
            state.service *= 2.0 ** (-(now - state.anchor) / half_life)
        state.anchor = now
        return state.service

    def response_usage(self, request: LLMRequest, prompt_tokens: int, completion_tokens: int) -> None:
        now = self.clock()
        state = self._program(request.header(FAIRNESS_ID_HEADER) or DEFAULT_FAIRNESS_ID)
        self._decayed(state, now)
        state.service += INPUT_WEIGHT * max(0, prompt_tokens) + OUTPUT_WEIGHT * max(0, completion_tokens)
        state.reported_service = state.service
        state.last_seen = now

    def pick(self, flows: list[FlowQueue], state: dict[str, Any]) -> FlowQueue:
        now = self.clock()
        self._sweep(now, flows)
        ordered = sorted(flows, key=lambda q: q.fairness_id)
        services, enqueued = [], []
        for flow in ordered:
            program = self._program(flow.fairness_id)
            program.last_seen = now
            services.append(self._decayed(program, now))
            head = flow.head()
            enqueued.append(head.enqueue_time if head is not None else now)
        # head wait = now - enqueue time: normalised, the oldest head is 1 and the newest 0
        waits = [-t for t in enqueued]
        lo_s, hi_s, lo_w, hi_w = min(services), max(services), min(waits), max(waits)
        w_service, w_wait = self.params.las_weight_service, self.params.las_weight_head_wait
        scores = [
            w_service * (1.0 - _normalise(s, lo_s, hi_s)) + w_wait * _normalise(w, lo_w, hi_w)
            for s, w in zip(services, waits, strict=True)
        ]
        best = ordered[max(range(len(ordered)), key=scores.__getitem__)]
        head = best.head()
        if head is not None:  # its head is dispatched now: the wait llm-d records at PreRequest
            program = self.programs[best.fairness_id]
            program.waits += 1
            program.avg_wait_ms += ((now - head.enqueue_time) * 1000.0 - program.avg_wait_ms) / program.waits
        return best

    def fairness_index(self) -> float:
        """Jain's index over the mean waits of the programs that have one (1.0 below two)."""
        waits = [p.avg_wait_ms for p in self.programs.values() if p.waits]
        square = sum(w * w for w in waits)
        return 1.0 if len(waits) <= 1 or square == 0 else sum(waits) ** 2 / (len(waits) * square)

    def gauges(self) -> dict[tuple[str, tuple[str, ...]], float]:
        """llm-d's three gauges, keyed (metric name, label values) as a metrics recorder keeps them."""
        out: dict[tuple[str, tuple[str, ...]], float] = {(FAIRNESS_INDEX, ()): self.fairness_index()}
        for pid, program in list(self.programs.items())[:MAX_PROGRAM_SERIES]:
            if program.waits:
                out[(AVG_WAIT_MS, (pid,))] = program.avg_wait_ms
            if program.reported_service is not None:
                out[(ATTAINED_SERVICE, (pid,))] = program.reported_service
        return out

    def _sweep(self, now: float, flows: list[FlowQueue]) -> None:
        if now - self._swept < self.params.eviction_sweep_seconds:
            return
        self._swept = now
        waiting = {q.fairness_id for q in flows}
        ttl = self.params.eviction_ttl_seconds
        for pid in [k for k, v in self.programs.items() if k not in waiting and now - v.last_seen > ttl]:
            del self.programs[pid]
