"""`low-queue-filter`: keep endpoints whose waiting queue is below a threshold (GIE legacy)."""

from __future__ import annotations

from pydantic import Field

from scheduler.cycle_state import CycleState
from scheduler.interfaces import Filter, Parameters
from scheduler.registry import register
from scheduler.types import Endpoint, LLMRequest


class LowQueueParameters(Parameters):
    # GIE's `threshold`; the original filter tree's constant queueingThresholdLoRA.
    threshold: int = Field(default=128, ge=0)


@register
class LowQueueFilter(Filter):
    """Keeps endpoints with waiting queue < threshold: lowQueueingPodPredicate of GIE's
    original filter tree (pkg/epp/scheduling/scheduler.go and filter.go at a70d66e5).

    GIE's later plugin of the same type kept queue <= threshold; the original predicate (kept here) is
    strict, so an endpoint with exactly `threshold` waiting requests is removed."""

    type_name = "low-queue-filter"
    Parameters = LowQueueParameters

    def filter(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        limit = self.params.threshold
        return [ep for ep in endpoints if ep.metrics.waiting_queue_size < limit]
