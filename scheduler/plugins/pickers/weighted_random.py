"""`weighted-random-picker`: up to maxNumOfEndpoints candidates drawn at random without replacement,
each with probability proportional to its score (A-Res weighted reservoir sampling, as GIE).

Each candidate with a positive score gets the key U^(1/score), U uniform in (0, 1]; the largest
keys win. Here the key is its logarithm, log(U)/score, which orders the same and does not underflow
for small scores. A candidate scoring 0 or less gets the lowest key: it is picked only when fewer
candidates score above 0 than are asked for. When no candidate scores above 0 the pick is uniform,
as `random-picker`."""

from __future__ import annotations

import heapq
import math

from scheduler.cycle_state import CycleState
from scheduler.plugins.pickers.random_picker import RandomPicker
from scheduler.registry import register
from scheduler.types import ProfileRunResult, ScoredEndpoint


@register
class WeightedRandomPicker(RandomPicker):
    type_name = "weighted-random-picker"

    def pick(self, cycle_state: CycleState, scored: list[ScoredEndpoint]) -> ProfileRunResult:
        if not any(s.score > 0 for s in scored):
            return super().pick(cycle_state, scored)
        rng = self.rng
        keyed = [
            (math.log(1.0 - rng.random()) / s.score if s.score > 0 else -math.inf, i) for i, s in enumerate(scored)
        ]
        n = self.params.max_num_of_endpoints
        best = [max(keyed)] if n == 1 else heapq.nlargest(n, keyed)
        return ProfileRunResult([scored[i].endpoint for _, i in best])
