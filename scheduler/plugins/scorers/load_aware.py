"""`load-aware-scorer` (llm-d): an empty waiting queue scores 0.5, falling linearly to 0 as the
queue reaches `threshold` (default 128) and staying 0 beyond it."""

from __future__ import annotations

from pydantic import Field

from scheduler.cycle_state import CycleState
from scheduler.interfaces import Parameters, Scorer, ScorerCategory
from scheduler.registry import register
from scheduler.types import Endpoint, LLMRequest

IDLE_SCORE = 0.5  # llm-d leaves the upper half for a future "has spare capacity" signal


class LoadAwareParameters(Parameters):
    # llm-d falls back to the default for a non-positive threshold; here it is a load-time error.
    threshold: int = Field(default=128, gt=0)


@register
class LoadAwareScorer(Scorer):
    type_name = "load-aware-scorer"
    category = ScorerCategory.DISTRIBUTION
    Parameters = LoadAwareParameters

    def score(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> dict[Endpoint, float]:
        threshold = float(self.params.threshold)
        return {ep: IDLE_SCORE * (1.0 - min(ep.metrics.waiting_queue_size, threshold) / threshold) for ep in endpoints}
