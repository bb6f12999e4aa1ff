"""`random-picker`: up to maxNumOfEndpoints candidates drawn uniformly at random, scores ignored."""

from __future__ import annotations

from scheduler.cycle_state import CycleState
from scheduler.interfaces import Picker, PluginHandle
from scheduler.plugins.pickers.max_score import PickerParameters
from scheduler.registry import register
from scheduler.types import ProfileRunResult, ScoredEndpoint


@register
class RandomPicker(Picker):
    type_name = "random-picker"
    Parameters = PickerParameters

    def setup(self, handle: PluginHandle) -> None:
        self.rng = handle.rng

    def pick(self, cycle_state: CycleState, scored: list[ScoredEndpoint]) -> ProfileRunResult:
        n = min(self.params.max_num_of_endpoints, len(scored))
        return ProfileRunResult([s.endpoint for s in self.rng.sample(scored, n)])
