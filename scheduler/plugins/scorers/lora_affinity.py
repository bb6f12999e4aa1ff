"""`lora-affinity-scorer`: prefer endpoints where the requested model (LoRA adapter) is already
loaded, then ones with a free adapter slot, then ones already loading it (GIE's rule order)."""

from __future__ import annotations

from scheduler.cycle_state import CycleState
from scheduler.interfaces import Scorer, ScorerCategory
from scheduler.registry import register
from scheduler.types import Endpoint, LLMRequest

ACTIVE = 1.0  # the adapter is loaded: ideal
HAS_ROOM = 0.8  # a slot is free to load one more adapter (active and waiting together below the max)
WAITING = 0.6  # the adapter is queued to be loaded here
UNSUITABLE = 0.0  # full, and not loading it


@register
class LoraAffinityScorer(Scorer):
    type_name = "lora-affinity-scorer"
    category = ScorerCategory.AFFINITY

    def score(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> dict[Endpoint, float]:
        model = request.target_model
        scores: dict[Endpoint, float] = {}
        for ep in endpoints:
            m = ep.metrics
            if model in m.active_models:
                scores[ep] = ACTIVE
            elif len(m.active_models) + len(m.waiting_models) < m.max_active_models:
                scores[ep] = HAS_ROOM
            elif model in m.waiting_models:
                scores[ep] = WAITING
            else:
                scores[ep] = UNSUITABLE
        return scores
