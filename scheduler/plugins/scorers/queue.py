"""`queue-scorer`: fewer waiting requests score higher, min-max normalised over the candidates."""

from __future__ import annotations

from scheduler.cycle_state import CycleState
from scheduler.interfaces import Scorer, ScorerCategory
from scheduler.plugins.scorers.min_max import fewer_is_better
from scheduler.registry import register
from scheduler.types import Endpoint, LLMRequest


@register
class QueueScorer(Scorer):
    type_name = "queue-scorer"
    category = ScorerCategory.DISTRIBUTION

    def score(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> dict[Endpoint, float]:
        return fewer_is_better(endpoints, [ep.metrics.waiting_queue_size for ep in endpoints])
