"""`kv-cache-utilization-scorer`: the emptier an endpoint's KV cache, the higher it scores
(1 - kv_cache_usage_percent, no normalisation across candidates)."""

from __future__ import annotations

from scheduler.cycle_state import CycleState
from scheduler.interfaces import Scorer, ScorerCategory
from scheduler.registry import register
from scheduler.types import Endpoint, LLMRequest


@register
class KVCacheUtilizationScorer(Scorer):
    type_name = "kv-cache-utilization-scorer"
    category = ScorerCategory.DISTRIBUTION

    def score(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> dict[Endpoint, float]:
        return {ep: 1.0 - ep.metrics.kv_cache_usage_percent for ep in endpoints}
