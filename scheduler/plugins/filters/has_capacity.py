"""`has-capacity-filter`: keep endpoints with a short queue and KV cache below a threshold.

noQueueAndLessThanKVCacheThresholdPredicate(queueThresholdCritical, kvCacheThreshold) of GIE's original
filter tree (pkg/epp/scheduling/scheduler.go and filter.go at a70d66e5),
which decides whether a sheddable request may run without hurting critical ones."""

from __future__ import annotations

from pydantic import Field

from scheduler.cycle_state import CycleState
from scheduler.interfaces import Filter, Parameters
from scheduler.registry import register
from scheduler.types import Endpoint, LLMRequest


class HasCapacityParameters(Parameters):
    queue_threshold: int = Field(default=5, alias="queueThreshold", ge=0)
    kv_cache_threshold: float = Field(default=0.8, alias="kvCacheThreshold", ge=0.0)


@register
class HasCapacityFilter(Filter):
    """Keeps endpoints with waiting queue <= queueThreshold and KV usage <= kvCacheThreshold
    (both inclusive, as in that predicate)."""

    type_name = "has-capacity-filter"
    Parameters = HasCapacityParameters

    def filter(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        q, kv = self.params.queue_threshold, self.params.kv_cache_threshold
        return [
            ep for ep in endpoints if ep.metrics.waiting_queue_size <= q and ep.metrics.kv_cache_usage_percent <= kv
        ]
