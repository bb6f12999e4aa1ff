"""`utilization-filter` (llm-d's pkg/epp/framework/plugins/scheduling/filter/utilization/filter.go):
drop an endpoint as soon as any condition's metric exceeds its `maxValue` (kept at or below it).

Metrics: `running-requests`, `waiting-queue` and `kv-cache-utilization` (a fraction, maxValue <= 1)
from the scraped metrics; `active-requests` from the requests this plugin instance counted in
flight, as `inflight-load-producer` counts them (scheduler/plugins/support/inflight_load_count.py; in the
Ray path, per profile actor). With `fallbackOnEmpty`, a cycle that would drop every endpoint keeps
them all. `inFlightLoadProducerName` is accepted only as the default name, `inflight-load-producer`
(the one producer Ray EPP's consumers read)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from scheduler.cycle_state import CycleState
from scheduler.interfaces import Filter, Parameters, PluginHandle
from scheduler.plugins.producers.inflight_load_producer import InFlightLoadProducer, inflight_load_for
from scheduler.plugins.support.inflight_load_count import InFlightLoadHooks
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

    @field_validator("in_flight_load_producer_name")
    @classmethod
    def _default_producer(cls, v: str) -> str:
        if v not in ("", InFlightLoadProducer.type_name):
            raise ValueError(f"only the default producer {InFlightLoadProducer.type_name!r} is read here")
        return v


@register
class UtilizationFilter(InFlightLoadHooks, Filter):
    type_name = "utilization-filter"
    Parameters = UtilizationFilterParameters

    def setup(self, handle: PluginHandle) -> None:
        self.load = inflight_load_for(handle)

    def filter(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        active = self.load.requests()
        kept = [ep for ep in endpoints if within(ep, self.params.conditions, active)]
        return endpoints if not kept and self.params.fallback_on_empty else kept


def within(ep: Endpoint, conditions: list[Condition], active: dict[str, int]) -> bool:
    """Whether every condition's metric is at or below its maxValue on `ep` (`active`: requests in
    flight per endpoint name, read by `active-requests` only)."""
    return all(metric_value(ep, c.metric, active) <= c.max_value for c in conditions)


def metric_value(ep: Endpoint, metric: str, active: dict[str, int]) -> float:
    m = ep.metrics
    if metric == "active-requests":
        return active.get(ep.name, 0)
    if metric == "running-requests":
        return m.running_requests_size
    if metric == "waiting-queue":
        return m.waiting_queue_size
    return m.kv_cache_usage_percent
