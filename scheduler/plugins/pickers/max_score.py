"""`max-score-picker`: the highest total score wins; ties are broken at random (GIE)."""

from __future__ import annotations

from pydantic import Field

from scheduler.cycle_state import CycleState
from scheduler.interfaces import Parameters, Picker, PluginHandle
from scheduler.plugins.support.cycle_rng import cycle_rng, salt
from scheduler.registry import register
from scheduler.types import ProfileRunResult, ScoredEndpoint


class PickerParameters(Parameters):
    max_num_of_endpoints: int = Field(default=1, alias="maxNumOfEndpoints", ge=1)


@register
class MaxScorePicker(Picker):
    type_name = "max-score-picker"
    Parameters = PickerParameters

    def setup(self, handle: PluginHandle) -> None:
        self.rng = handle.rng
        self.rng_salt = salt(self.rng)

    def pick(self, cycle_state: CycleState, scored: list[ScoredEndpoint]) -> ProfileRunResult:
        n = self.params.max_num_of_endpoints
        if n == 1 and scored:  # the common case: one pass, reservoir tie-break
            best = scored[0]
            ties = 1
            for s in scored[1:]:
                if s.score > best.score:
                    best, ties = s, 1
                elif s.score == best.score:
                    ties += 1
                    if cycle_rng(cycle_state, self).random() * ties < 1.0:
                        best = s
            return ProfileRunResult([best.endpoint])
        shuffled = list(scored)
        cycle_rng(cycle_state, self).shuffle(shuffled)
        shuffled.sort(key=lambda s: s.score, reverse=True)  # stable: shuffled order breaks ties
        return ProfileRunResult([s.endpoint for s in shuffled[:n]])
