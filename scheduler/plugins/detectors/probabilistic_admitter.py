"""`probabilistic-admitter` (llm-d's pkg/epp/framework/plugins/requestcontrol/admitter/
probabilisticadmitter): shed sheddable requests at random, more as the pool fills, instead of all at
once past a line.

Saturation is the roofline average over pods of max(waiting queue / queueDepthThreshold,
KV use / kvCacheUtilThreshold) (the utilization detector's formula, without its staleness rule, as
llm-d's admitter has none); a sheddable request is rejected with probability
min(saturation^power * k, 1): with the defaults (power 5, k 300) about 2% at saturation 0.15 and all
at 0.34. No pods: admit. Requests with priority >= 0 are never asked.

llm-d runs it at its admission extension point (an Admitter). Ray EPP's admission asks saturation
detectors for each sheddable request before scheduling it (429 when one says yes), so the admitter
is one of them, asked per request (`per_request`) even when the config names its saturation
detector (flowControl.saturationDetector), as llm-d asks both. Draws come from `rng` (seeded in the
benchmark's simulation)."""

from __future__ import annotations

from pydantic import Field

from scheduler.interfaces import Parameters, PluginHandle, SaturationDetector
from scheduler.plugins.detectors.utilization_detector import UtilizationDetector
from scheduler.registry import register
from scheduler.types import Endpoint

NEVER_STALE = "1000000h"  # the roofline without staleness


class ProbabilisticAdmitterParameters(Parameters):
    queue_depth_threshold: int = Field(default=5, alias="queueDepthThreshold", gt=0)
    kv_cache_util_threshold: float = Field(default=0.8, alias="kvCacheUtilThreshold", gt=0.0, le=1.0)
    power: float = Field(default=5.0, gt=0.0)
    k: float = Field(default=300.0, gt=0.0)


@register
class ProbabilisticAdmitter(SaturationDetector):
    type_name = "probabilistic-admitter"
    Parameters = ProbabilisticAdmitterParameters
    per_request = True

    def setup(self, handle: PluginHandle) -> None:
        p = self.params
        self.roofline = UtilizationDetector(
            params=UtilizationDetector.Parameters(
                queueDepthThreshold=p.queue_depth_threshold,
                kvCacheUtilThreshold=p.kv_cache_util_threshold,
                metricsStalenessThreshold=NEVER_STALE,
            )
        )
        self.rng = handle.rng

    def reject_probability(self, endpoints: list[Endpoint]) -> float:
        if not endpoints:
            return 0.0
        saturation = self.roofline.saturation(endpoints)
        return min(saturation**self.params.power * self.params.k, 1.0)

    def is_pool_saturated(self, endpoints: list[Endpoint]) -> bool:
        """Whether this sheddable request is shed: a draw against reject_probability."""
        p = self.reject_probability(endpoints)
        return p > 0.0 and self.rng.random() < p
