"""`latency-scorer` (llm-d-router's predicted-latency plugins): score endpoints by this request's
predicted latency (the PREDICTED_LATENCY key of the `predicted-latency-producer` that
`predictorName` names, default that type's name).

* No SLO header: the lowest predicted TTFT scores 1, the highest 0 (min-max), as llm-d picks the
  lowest-latency endpoint when prediction-based scheduling runs without SLOs.
* With `x-slo-ttft-ms` / `x-slo-tpot-ms`: endpoints predicted to meet every target score in
  [0.5, 1], ranked by relative headroom: `headroomSelectionStrategy: least` (llm-d's bin-packing default,
  the tightest fit scores 1, keeping roomy endpoints for later requests) or `most` (the safest
  fit scores 1); those predicted to miss score in [0, 0.5), the least deficit highest.
* A cold predictor or `x-prediction-based-scheduling: false`: every endpoint scores 1 (neutral), so
  the profile's other scorers decide, as they do today."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from scheduler.cycle_state import CycleState
from scheduler.interfaces import PluginHandle, Scorer, ScorerCategory
from scheduler.plugins.support.latency_prediction import PredictorParameters, predicted_latency_key
from scheduler.plugins.support.slo import relative_headroom, slo_targets
from scheduler.registry import register
from scheduler.types import Endpoint, LLMRequest


class LatencyScorerParameters(PredictorParameters):
    headroom_selection: Literal["least", "most"] = Field(default="least", alias="headroomSelectionStrategy")


@register
class LatencyScorer(Scorer):
    type_name = "latency-scorer"
    category = ScorerCategory.BALANCE
    Parameters = LatencyScorerParameters

    def setup(self, handle: PluginHandle) -> None:
        self.predicted_key = predicted_latency_key(handle, self.params.predictor_name)
        self.consumes = (self.predicted_key,)

    def score(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> dict[Endpoint, float]:
        targets = slo_targets(request)
        predicted = cycle_state.get(self.predicted_key) if targets.prediction else None
        if predicted is None or not endpoints:
            return dict.fromkeys(endpoints, 1.0)
        if targets.any:
            headroom = {
                ep: relative_headroom(targets, predicted[ep.name].ttft_ms, predicted[ep.name].tpot_ms)
                for ep in endpoints
            }
            return self._by_headroom({ep: h for ep, h in headroom.items() if h is not None})
        ttft = {ep: predicted[ep.name].ttft_ms for ep in endpoints}
        return _inverse_min_max(ttft)

    def _by_headroom(self, headroom: dict[Endpoint, float]) -> dict[Endpoint, float]:
        meeting = {ep: h for ep, h in headroom.items() if h >= 0.0}
        missing = {ep: h for ep, h in headroom.items() if h < 0.0}
        scores: dict[Endpoint, float] = {}
        if meeting:
            rank = _inverse_min_max(meeting) if self.params.headroom_selection == "least" else _min_max(meeting)
            scores.update({ep: 0.5 + 0.5 * s for ep, s in rank.items()})
        if missing:
            scores.update({ep: 0.49 * s for ep, s in _min_max(missing).items()})
        return scores


def _min_max(values: dict[Endpoint, float]) -> dict[Endpoint, float]:
    low, high = min(values.values()), max(values.values())
    if high == low:
        return dict.fromkeys(values, 1.0)
    return {ep: (v - low) / (high - low) for ep, v in values.items()}


def _inverse_min_max(values: dict[Endpoint, float]) -> dict[Endpoint, float]:
    """The lowest value scores 1, the highest 0; all equal score 1."""
    low, high = min(values.values()), max(values.values())
    if high == low:
        return dict.fromkeys(values, 1.0)
    return {ep: (high - v) / (high - low) for ep, v in values.items()}
