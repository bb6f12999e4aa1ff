"""`slo-headroom-tier-filter` (llm-d-router's predicted-latency plugins): for a request carrying
`x-slo-ttft-ms` / `x-slo-tpot-ms`, keep the tier of endpoints predicted to meet every target
(positive headroom); when none is, keep them all (the scorers then prefer the least deficit).
A request without targets, with `x-prediction-based-scheduling: false`, or a predictor still cold
(no PREDICTED_LATENCY key in the cycle state) passes every endpoint: today's scorers decide."""

from __future__ import annotations

from scheduler.cycle_state import CycleState
from scheduler.interfaces import Filter, PluginHandle
from scheduler.plugins.support.latency_prediction import PredictorParameters, predicted_latency_key
from scheduler.plugins.support.slo import relative_headroom, slo_targets
from scheduler.registry import register
from scheduler.types import Endpoint, LLMRequest


@register
class SLOHeadroomTierFilter(Filter):
    type_name = "slo-headroom-tier-filter"
    Parameters = PredictorParameters

    def setup(self, handle: PluginHandle) -> None:
        self.predicted_key = predicted_latency_key(handle, self.params.predictor_name)
        self.consumes = (self.predicted_key,)

    def filter(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        targets = slo_targets(request)
        if not targets.any or not targets.prediction:
            return endpoints
        predicted = cycle_state.get(self.predicted_key)
        if predicted is None:
            return endpoints
        meeting = []
        for ep in endpoints:
            p = predicted[ep.name]
            headroom = relative_headroom(targets, p.ttft_ms, p.tpot_ms)
            if headroom is not None and headroom >= 0.0:
                meeting.append(ep)
        return meeting or endpoints
