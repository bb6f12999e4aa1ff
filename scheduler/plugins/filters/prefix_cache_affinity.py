"""`prefix-cache-affinity-filter` (llm-d's pkg/epp/framework/plugins/scheduling/filter/
prefixcacheaffinity/plugin.go): "sticky until saturated". Keeps only the endpoints that already
hold most of the prompt, so a request does not pay a prefill another endpoint has cached, until
those endpoints are so loaded that the best of them would start it later than the best of the rest
by more than `maxTTFTPenaltyMs`; then every endpoint stays and the scorers after it decide.

* An endpoint is sticky when its prefix-cache match (matched blocks / the prompt's blocks) is at
  least `affinityThreshold` (0.8). No sticky endpoint, one candidate, or a threshold of 0: all stay.
* With probability `explorationProbability` (0) the gate is skipped, seeding caches elsewhere.
* Ray EPP's addition, not llm-d's: `saturationConditions` (utilization-filter's conditions on
  scraped metrics: `waiting-queue`, `running-requests`, `kv-cache-utilization`). A sticky endpoint
  over any of them is not sticky. The gate below sees only the tokens this router sent; a pod
  overloaded by traffic it does not see (other gateways, direct clients, a slow engine) shows only
  in its scraped queue and KV use, and must not keep its sticky requests. None by default (llm-d's
  behaviour; llm-d's configs put a `utilization-filter` in front instead, which drops such a pod
  from every choice, where this only ends its claim on the request).
* The load gate compares the lowest TTFT among the sticky endpoints with the lowest among the rest:
  with `ttftSource: prefillThroughput` (the default) an endpoint's TTFT is its in-flight tokens /
  `peakPrefillThroughput` (15,928 tokens/s, llm-d's H100 calibration) in ms, the tokens
  `inflight-load-producer` counts (uncached prompt tokens, released at the first token) and writes
  under INFLIGHT_LOAD for this run (`inFlightLoadProducerName` names another); with
  `latencyPredictor` it is this request's TTFT as predicted by the `predicted-latency-producer` that
  `latencyPredictionInfoProducerName` names (its PREDICTED_LATENCY key; default that type's name).
  A side without the signal (a cold predictor) skips the gate and keeps all, as llm-d does.
  `maxTTFTPenaltyMs: 0` always sticks.

The match comes from `prefixMatchInfoProducerName` (else the prefix-cache-scorer's producer, else
the plugin called `approx-prefix-cache-producer`), found as `no-hit-lru-scorer` finds it; the
producer's match is written once per cycle, before the filters, so the scorers after this filter
read the same one; the producers learn each decision themselves (this filter has no hooks).
`prefillCalibrationFile` (a calibration record) is refused: set `peakPrefillThroughput`.

llm-d's advice holds here too: after this filter, use one load scorer (`token-load-scorer` for
prefill-bound traffic) and no separately weighted prefix scorer, else the break can not move a
request off a warm endpoint."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from scheduler.cycle_state import CycleState
from scheduler.data_keys import DataKey
from scheduler.interfaces import Filter, Parameters, PluginHandle
from scheduler.plugins.filters.utilization_filter import Condition, within
from scheduler.plugins.scorers.no_hit_lru import find_prefix_match_key
from scheduler.plugins.support.inflight_load_count import INFLIGHT_LOAD, InFlightSnapshot
from scheduler.plugins.support.latency_prediction import Prediction, predicted_latency_key
from scheduler.registry import register
from scheduler.types import Endpoint, LLMRequest

DEFAULT_PEAK_PREFILL_THROUGHPUT = 15928.0  # tokens/s: llm-d's calibration (Qwen 32B, 2x H100, TP=2, vLLM 0.19)

# What a filter run decided, counted per outcome (llm-d's decisions_total outcomes).
# "saturated": endpoints held the prompt, but every one was over a saturation condition.
OUTCOMES = ("not_applicable", "exploration", "no_match", "saturated", "missing_signal", "load_override", "sticky")
NOT_APPLICABLE, EXPLORATION, NO_MATCH, SATURATED, MISSING_SIGNAL, LOAD_OVERRIDE, STICKY = OUTCOMES


class PrefixCacheAffinityParameters(Parameters):
    affinity_threshold: float = Field(default=0.80, alias="affinityThreshold", ge=0.0, le=1.0)
    exploration_probability: float = Field(default=0.0, alias="explorationProbability", ge=0.0, le=1.0)
    max_ttft_penalty_ms: float = Field(default=18000.0, alias="maxTTFTPenaltyMs", ge=0.0)
    ttft_source: Literal["prefillThroughput", "latencyPredictor"] = Field(
        default="prefillThroughput", alias="ttftSource"
    )
    peak_prefill_throughput: float = Field(
        default=DEFAULT_PEAK_PREFILL_THROUGHPUT, alias="peakPrefillThroughput", ge=0.0
    )
    prefill_calibration_file: str = Field(default="", alias="prefillCalibrationFile")
    prefill_calibration_fingerprint: str = Field(default="", alias="prefillCalibrationFingerprint")
    prefill_calibration_required: bool = Field(default=False, alias="prefillCalibrationRequired")
    prefix_match_info_producer_name: str = Field(default="", alias="prefixMatchInfoProducerName")
    latency_prediction_info_producer_name: str = Field(default="", alias="latencyPredictionInfoProducerName")
    in_flight_load_producer_name: str = Field(default="", alias="inFlightLoadProducerName")
    saturation_conditions: list[Condition] = Field(default_factory=list, alias="saturationConditions")

    @field_validator("saturation_conditions")
    @classmethod
    def _scraped_only(cls, conditions: list[Condition]) -> list[Condition]:
        for c in conditions:
            if c.metric == "active-requests":
                raise ValueError(
                    "saturationConditions read scraped metrics (waiting-queue, running-requests, "
                    "kv-cache-utilization); the router's own in-flight load is the maxTTFTPenaltyMs gate's"
                )
        return conditions

    @field_validator("prefill_calibration_file")
    @classmethod
    def _no_calibration_records(cls, value: str) -> str:
        if value:
            raise ValueError(
                "calibration records are not read here: measure the pods' peak prefill throughput and set "
                "peakPrefillThroughput"
            )
        return value

    @model_validator(mode="after")
    def _throughput_needed(self) -> PrefixCacheAffinityParameters:
        gate = self.max_ttft_penalty_ms > 0 and self.ttft_source == "prefillThroughput"
        if gate and self.peak_prefill_throughput == 0:
            raise ValueError("peakPrefillThroughput must be > 0 when ttftSource is prefillThroughput")
        return self


@register
class PrefixCacheAffinityFilter(Filter):
    type_name = "prefix-cache-affinity-filter"
    Parameters = PrefixCacheAffinityParameters

    def setup(self, handle: PluginHandle) -> None:
        p = self.params
        self.match_key = find_prefix_match_key(handle, p.prefix_match_info_producer_name)
        self.consumes = (self.match_key,)
        self.rng = handle.rng
        self.decisions = dict.fromkeys(OUTCOMES, 0)
        self.load_key: DataKey[InFlightSnapshot] | None = None
        self.predicted_key: DataKey[dict[str, Prediction]] | None = None
        if p.max_ttft_penalty_ms > 0 and p.ttft_source == "prefillThroughput":
            self.load_key = INFLIGHT_LOAD.of(p.in_flight_load_producer_name)
            self.consumes = (self.match_key, self.load_key)
        elif p.max_ttft_penalty_ms > 0:
            name, field = p.latency_prediction_info_producer_name, "latencyPredictionInfoProducerName"
            self.predicted_key = predicted_latency_key(handle, name, field)
            self.consumes = (self.match_key, self.predicted_key)

    # -- the filter ------------------------------------------------------------------------------

    def filter(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        p = self.params
        if len(endpoints) <= 1 or p.affinity_threshold <= 0:
            return self._decided(NOT_APPLICABLE, endpoints)
        if p.exploration_probability > 0 and self.rng.random() < p.exploration_probability:
            return self._decided(EXPLORATION, endpoints)
        infos = cycle_state.get(self.match_key, {})
        sticky, rest = [], []
        for ep in endpoints:
            info = infos.get(ep.name)
            score = info.match_blocks / info.total_blocks if info is not None and info.total_blocks > 0 else 0.0
            (sticky if score >= p.affinity_threshold else rest).append(ep)
        if not sticky:
            return self._decided(NO_MATCH, endpoints)
        if p.saturation_conditions:
            rest += [ep for ep in sticky if not within(ep, p.saturation_conditions, {})]
            sticky = [ep for ep in sticky if within(ep, p.saturation_conditions, {})]
            if not sticky:
                return self._decided(SATURATED, endpoints)
        if p.max_ttft_penalty_ms > 0 and rest:
            ttft = self._ttft_ms(cycle_state, request, endpoints)
            best_sticky = min((ttft[ep.name] for ep in sticky if ep.name in ttft), default=None)
            best_rest = min((ttft[ep.name] for ep in rest if ep.name in ttft), default=None)
            if best_sticky is None or best_rest is None:
                return self._decided(MISSING_SIGNAL, endpoints)
            if best_sticky - best_rest > p.max_ttft_penalty_ms:
                return self._decided(LOAD_OVERRIDE, endpoints)
        return self._decided(STICKY, sticky)

    def _ttft_ms(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> dict[str, float]:
        """Per endpoint name, the TTFT the gate compares (an endpoint without the signal absent)."""
        if self.predicted_key is not None:
            predicted = cycle_state.get(self.predicted_key, {})
            return {name: pr.ttft_ms for name, pr in predicted.items()}
        load = cycle_state.get(self.load_key) if self.load_key is not None else None
        if load is None:
            return {}
        tokens, per_ms = load.tokens, self.params.peak_prefill_throughput / 1000.0
        return {ep.name: tokens.get(ep.name, 0) / per_ms for ep in endpoints}

    def _decided(self, outcome: str, endpoints: list[Endpoint]) -> list[Endpoint]:
        self.decisions[outcome] += 1
        return endpoints
