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
sweep starts the program again from what it then costs). Its Prometheus gauges are not exported.

The policy runs in each gateway replica's queue, so a replica ranks programs by the service of the
responses it relayed itself, as its queue holds only its own requests."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field

from scheduler.flowcontrol.types import DEFAULT_FAIRNESS_ID, FAIRNESS_ID_HEADER, FlowQueue
from scheduler.interfaces import FairnessPolicy, Parameters, PluginHandle, ResponseUsage
from scheduler.registry import register
from scheduler.types import LLMRequest

INPUT_WEIGHT, OUTPUT_WEIGHT = 1, 2


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


def _normalise(value: float, low: float, high: float) -> float:
    return 0.5 if high == low else (value - low) / (high - low)


@register
class ProgramAwareFairness(FairnessPolicy, ResponseUsage):
    type_name = "program-aware-fairness"
    Parameters = ProgramAwareParameters

    def setup(self, handle: PluginHandle) -> None:
        self.clock: Callable[[], float] = time.monotonic
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
        return ordered[max(range(len(ordered)), key=scores.__getitem__)]

    def _sweep(self, now: float, flows: list[FlowQueue]) -> None:
        if now - self._swept < self.params.eviction_sweep_seconds:
            return
        self._swept = now
        waiting = {q.fairness_id for q in flows}
        ttl = self.params.eviction_ttl_seconds
        for pid in [k for k, v in self.programs.items() if k not in waiting and now - v.last_seen > ttl]:
            del self.programs[pid]
