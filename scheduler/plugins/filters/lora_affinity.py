"""`lora-affinity-filter`: prefer endpoints that hold the requested adapter (GIE legacy
loRASoftAffinityFilter).

Endpoints fall in two groups: *affinity* (the adapter is active or waiting there) and *available*
(it is not, but the server has a free adapter slot). When both groups are non-empty the affinity
group is returned with probability `threshold` (0.999), else the available group, so that an
adapter's load spreads beyond the servers that already hold it. Otherwise the non-empty group is
returned; an empty result (no endpoint holds the adapter or has room) is the filter failing.

GIE's original filter tree (pkg/epp/scheduling/scheduler.go and filter.go at a70d66e5) counted
running and waiting adapters together (its ActiveModels held both) against max_lora; here they are
separate sets, so their union is what is counted."""

from __future__ import annotations

from pydantic import Field

from scheduler.cycle_state import CycleState
from scheduler.interfaces import Filter, Parameters, PluginHandle
from scheduler.registry import register
from scheduler.types import Endpoint, LLMRequest


class LoraAffinityParameters(Parameters):
    # GIE's `threshold`; the original filter tree's constant loraAffinityThreshold.
    threshold: float = Field(default=0.999, ge=0.0, le=1.0)


@register
class LoraAffinityFilter(Filter):
    type_name = "lora-affinity-filter"
    Parameters = LoraAffinityParameters

    def setup(self, handle: PluginHandle) -> None:
        self.rng = handle.rng

    def filter(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        model = request.target_model
        affinity: list[Endpoint] = []
        available: list[Endpoint] = []
        for ep in endpoints:
            m = ep.metrics
            if model in m.active_models or model in m.waiting_models:
                affinity.append(ep)
            elif len(m.active_models.keys() | m.waiting_models.keys()) < m.max_active_models:
                available.append(ep)
        if affinity and available:
            return affinity if self.rng.random() < self.params.threshold else available
        return affinity or available
