"""`utilization-filter` (llm-d's pkg/epp/framework/plugins/scheduling/filter/utilization/filter.go):
drop an endpoint as soon as any condition's metric exceeds its `maxValue` (kept at or below it).

Metrics: `running-requests`, `waiting-queue` and `kv-cache-utilization` (a fraction, maxValue <= 1)
from the scraped metrics; `active-requests` from the requests in flight that
`inflight-load-producer` counts (scheduler/plugins/support/inflight_load_count.py) and writes under
INFLIGHT_LOAD for this profile run (none when it failed: every endpoint then has 0). With
`fallbackOnEmpty`, a cycle that would drop every endpoint keeps them all.
`inFlightLoadProducerName` names the producer read (default `inflight-load-producer`, made with its
defaults when the config declares none)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from scheduler.cycle_state import CycleState
from scheduler.interfaces import Filter, Parameters, PluginHandle
from scheduler.plugins.support.inflight_load_count import INFLIGHT_LOAD
from scheduler.registry import register
from scheduler.types import Endpoint, LLMRequest

Metric = Literal["active-requests", "running-requests", "waiting-queue", "kv-cache-utilization"]


class Condition(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    metric: Metric
    max_value: float = Field(alias="maxValue", ge=0.0)

    @model_validator(mode="after")
    def _fraction(self) -> Condition:
        if self.metric == "kv-cache-utilization" and self.max_value > 1.0:
            raise ValueError(
                f"maxValue for kv-cache-utilization is a fraction and must be at most 1, got {self.max_value}"
            )
        return self


class UtilizationFilterParameters(Parameters):
    conditions: list[Condition] = Field(min_length=1)
    fallback_on_empty: bool = Field(default=False, alias="fallbackOnEmpty")
    in_flight_load_producer_name: str = Field(default="", alias="inFlightLoadProducerName")


@register
class UtilizationFilter(Filter):
    type_name = "utilization-filter"
    Parameters = UtilizationFilterParameters

    def setup(self, handle: PluginHandle) -> None:
        p = self.params
        self.load_key = INFLIGHT_LOAD.of(p.in_flight_load_producer_name)
        if any(c.metric == "active-requests" for c in p.conditions):  # the one metric it reads
            self.consumes = (self.load_key,)

    def filter(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        load = cycle_state.get(self.load_key) if self.consumes else None
        active = load.requests if load is not None else {}
        kept = [ep for ep in endpoints if within(ep, self.params.conditions, active)]
        return endpoints if not kept and self.params.fallback_on_empty else kept


def within(ep: Endpoint, conditions: list[Condition], active: Mapping[str, int]) -> bool:
    """Whether every condition's metric is at or below its maxValue on `ep` (`active`: requests in
    flight per endpoint name, read by `active-requests` only)."""
    return all(metric_value(ep, c.metric, active) <= c.max_value for c in conditions)


def metric_value(ep: Endpoint, metric: str, active: Mapping[str, int]) -> float:
    m = ep.metrics
    if metric == "active-requests":
        return active.get(ep.name, 0)
    if metric == "running-requests":
        return m.running_requests_size
    if metric == "waiting-queue":
        return m.waiting_queue_size
    return m.kv_cache_usage_percent
