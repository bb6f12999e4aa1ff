"""`running-requests-size-scorer` (GIE's runningrequests): fewer requests running on the model server
score higher, min-max normalised over the candidates; 1.0 for all when they are level."""

from __future__ import annotations

from scheduler.cycle_state import CycleState
from scheduler.interfaces import Scorer, ScorerCategory
from scheduler.plugins.scorers.min_max import fewer_is_better
from scheduler.registry import register
from scheduler.types import Endpoint, LLMRequest


@register
class RunningRequestsSizeScorer(Scorer):
    type_name = "running-requests-size-scorer"
    category = ScorerCategory.DISTRIBUTION

    def score(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> dict[Endpoint, float]:
        return fewer_is_better(endpoints, [ep.metrics.running_requests_size for ep in endpoints])
