"""`latency-slo-admitter` (llm-d-router's predicted-latency plugins): refuse a request that carries
an SLO (`x-slo-ttft-ms` / `x-slo-tpot-ms`) when no candidate endpoint is predicted to meet it,
rather than serve it late. Off unless a config names it. The refusal is ResourceExhausted (429,
OpenAI-shaped at the gateway) with a message naming the SLO and the best prediction, so a client
can retry later or relax the target. `onlySheddable` (default true) refuses only sheddable
requests (priority < 0) and lets others through to the best endpoint, as llm-d's admitter does.
As in llm-d, an endpoint that is idle (nothing running or waiting) or cold (KV use under 2 %) admits
the request whatever its prediction (a prediction there is least informed and the endpoint can
start at once); `admitIdleOrCold: false` turns that off. A cold predictor, a request without targets or with
`x-prediction-based-scheduling: false` is never refused."""

from __future__ import annotations

from pydantic import Field

from scheduler.cycle_state import FILTER_FAILURE_KEY, CycleState
from scheduler.errors import ErrorCode, SchedulingError
from scheduler.interfaces import Filter, PluginHandle
from scheduler.plugins.support.latency_prediction import PredictorParameters, predicted_latency_key
from scheduler.plugins.support.slo import relative_headroom, slo_targets
from scheduler.registry import register
from scheduler.types import Endpoint, LLMRequest


class LatencySLOAdmitterParameters(PredictorParameters):
    only_sheddable: bool = Field(default=True, alias="onlySheddable")
    # llm-d's rule, fixed there; a parameter here so a test can see a refusal from quiet pods.
    admit_idle_or_cold: bool = Field(default=True, alias="admitIdleOrCold")


@register
class LatencySLOAdmitter(Filter):
    type_name = "latency-slo-admitter"
    Parameters = LatencySLOAdmitterParameters
    needs_profile_reference = True  # the loader refuses it listed only under plugins

    def setup(self, handle: PluginHandle) -> None:
        self.predicted_key = predicted_latency_key(handle, self.params.predictor_name)
        self.consumes = (self.predicted_key,)
        self.refused = 0

    def filter(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        targets = slo_targets(request)
        if not targets.any or not targets.prediction or (self.params.only_sheddable and not request.sheddable):
            return endpoints
        predicted = cycle_state.get(self.predicted_key)
        if (
            predicted is None
            or not endpoints
            or (self.params.admit_idle_or_cold and any(map(_idle_or_cold, endpoints)))
        ):
            return endpoints
        best = max(endpoints, key=lambda ep: _headroom(targets, predicted[ep.name]))
        if _headroom(targets, predicted[best.name]) >= 0.0:
            return endpoints
        self.refused += 1
        p = predicted[best.name]
        tpot = f", TPOT {p.tpot_ms:.0f} ms" if p.tpot_ms is not None else ""
        message = (
            f"no endpoint is predicted to meet the request's SLO ({targets.describe()}): "
            f"the best, {best.name}, is predicted at TTFT {p.ttft_ms:.0f} ms{tpot}"
        )
        cycle_state.write(FILTER_FAILURE_KEY, SchedulingError(ErrorCode.RESOURCE_EXHAUSTED, message))
        return []


COLD_KV_USE = 0.02


def _idle_or_cold(ep: Endpoint) -> bool:
    m = ep.metrics
    return (m.running_requests_size == 0 and m.waiting_queue_size == 0) or m.kv_cache_usage_percent < COLD_KV_USE


def _headroom(targets, prediction) -> float:
    headroom = relative_headroom(targets, prediction.ttft_ms, prediction.tpot_ms)
    return headroom if headroom is not None else 0.0
