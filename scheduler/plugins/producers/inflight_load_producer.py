"""`inflight-load-producer` (llm-d's pkg/epp/framework/plugins/requestcontrol/dataproducer/
inflightload): counts the requests and tokens in flight per endpoint, from the decisions and
responses it hears (scheduler/plugins/support/inflight_load_count.py has the rules), and writes
them, with what this request would add, under `INFLIGHT_LOAD` in each profile run for
`token-load-scorer`, `utilization-filter`, `concurrency-detector` and `prefix-cache-affinity-filter`.

One count per process that runs it: a profile actor (told every decision), a Serve router's mirror,
a gateway replica where a detector asks at admission (that replica's own traffic), the in-process
Scheduler. A detector asked outside a profile run reads `inflight_counts()`. llm-d creates the
producer with its defaults when a consumer needs it and none is configured; so does Ray EPP
(`made_when_needed`)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from scheduler.cycle_state import CycleState
from scheduler.interfaces import Parameters, PluginHandle, Producer
from scheduler.plugins.support.inflight_load_count import (
    INFLIGHT_LOAD,
    InFlightCounts,
    InFlightLoad,
    InFlightLoadHooks,
    LoadEstimate,
)
from scheduler.registry import register
from scheduler.types import Endpoint, LLMRequest


class InFlightLoadProducerParameters(Parameters):
    add_estimated_output_tokens: bool = Field(default=False, alias="addEstimatedOutputTokens")
    output_ratio: float = Field(default=1.5, alias="outputRatio", ge=0.0)
    max_estimated_output_tokens: int | None = Field(default=None, alias="maxEstimatedOutputTokens", ge=0)


@register
class InFlightLoadProducer(InFlightLoadHooks, Producer):
    type_name = "inflight-load-producer"
    Parameters = InFlightLoadProducerParameters
    made_when_needed: ClassVar[bool] = True  # config.data_flow.made_producer_class

    def setup(self, handle: PluginHandle) -> None:
        p = self.params
        estimate = LoadEstimate(p.add_estimated_output_tokens, p.output_ratio, p.max_estimated_output_tokens)
        self.load = InFlightLoad(estimate, handle.clock)
        self.produces = (INFLIGHT_LOAD.of(self.name),)

    def produce(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> None:
        cycle_state.put(self.produces[0], self.load.snapshot(request))

    def inflight_counts(self) -> InFlightCounts:
        return self.load
