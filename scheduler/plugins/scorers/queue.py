"""`queue-scorer`: fewer waiting requests score higher, min-max normalised over the candidates."""

from __future__ import annotations

from scheduler.cycle_state import CycleState
from scheduler.interfaces import Scorer, ScorerCategory
from scheduler.registry import register
from scheduler.types import Endpoint, LLMRequest


@register
class QueueScorer(Scorer):
    type_name = "queue-scorer"
    category = ScorerCategory.DISTRIBUTION

    def score(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> dict[Endpoint, float]:
        if not endpoints:
            return {}
        queues = [ep.metrics.waiting_queue_size for ep in endpoints]
        lo, hi = min(queues), max(queues)
        if hi == lo:  # all equal: every endpoint is as good as the others
            return dict.fromkeys(endpoints, 1.0)
        span = hi - lo
        return {ep: (hi - q) / span for ep, q in zip(endpoints, queues, strict=True)}
