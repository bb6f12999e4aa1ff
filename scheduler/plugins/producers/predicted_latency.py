"""`predicted-latency-producer` (llm-d-router pkg/epp/framework/plugins/.../predictedlatency): per
candidate endpoint, this request's predicted TTFT and TPOT, for `latency-scorer`,
`slo-headroom-tier-filter` and `latency-slo-admitter`, which look it up by name
(`predictorName`, default this type's name) and relay the lifecycle hooks to it, once per event.

llm-d asks trained models in sidecars; here the model is in the plugin (scheduler/plugins/support/
latency_model.py: RLS per endpoint with a pool-wide prior), learned from what the hooks report:

* PreRequest: the target's features at decision time (scraped waiting / running / KV use, this
  request's uncached prompt tokens there by the prefix scorer's match, and this producer's own
  ledger of prompt tokens and requests sent there whose first token has not come), and the time.
* ResponseFirstToken: TTFT = now - decision time, one observation for the TTFT model.
* ResponseComplete: TPOT = (now - first token) / (output tokens - 1), the output length taken as
  the client's `max_tokens` (the gateway sees no token count in the hook); one TPOT observation.

In the Ray path the state lives in each profile actor (every replica's events reach it), as the
prefix index does; each shard of a sharded profile learns from its own share of the traffic."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import Field

from scheduler.body_fields import OUTPUT_LIMIT_FIELDS, PROMPT_FIELDS
from scheduler.cycle_state import CycleState
from scheduler.data_keys import DataKey
from scheduler.interfaces import (
    Filter,
    Parameters,
    PluginHandle,
    PreRequest,
    ResponseComplete,
    ResponseFirstToken,
)
from scheduler.plugins.support.inflight_ledger import InFlightLedger
from scheduler.plugins.support.latency_model import TPOT_FEATURES, TTFT_FEATURES, LatencyModel
from scheduler.plugins.support.prefill_ledger import prefill_target, prompt_tokens, uncached_tokens
from scheduler.plugins.support.prefix import PREFIX_MATCH_KEY
from scheduler.registry import register
from scheduler.types import Endpoint, LLMRequest, SchedulingResult

LOST_AFTER_S = 600.0


@dataclass(slots=True)
class Prediction:
    ttft_ms: float
    tpot_ms: float | None  # None until the TPOT model is warm


@dataclass(slots=True)
class _Pending:
    endpoint: str
    ttft_x: list[float]
    tpot_x: list[float]
    sent_at: float
    output_tokens: int
    first_at: float | None = None


class PredictedLatencyParameters(Parameters):
    # llm-d's: with true it trains TTFT from the first streamed token and TPOT from the stream.
    # Here that is what happens either way: a streamed response teaches TTFT and TPOT, and a
    # non-streamed one teaches nothing (the hooks see no first token). Accepted so llm-d's configs load.
    streaming_mode: bool = Field(default=False, alias="streamingMode")
    min_samples: int = Field(default=16, alias="minSamples", ge=1)
    forgetting_factor: float = Field(default=0.995, alias="forgettingFactor", gt=0.5, le=1.0)


def output_tokens(request: LLMRequest) -> int:
    for key in OUTPUT_LIMIT_FIELDS:
        value = request.body.get(key)
        if type(value) is int and value > 0:
            return value
    return 0


@register
class PredictedLatencyProducer(Filter):
    """A filter only so that llm-d's configs, which list the producer in the profile (it prepares
    data there), load: as a filter it passes every endpoint."""

    type_name = "predicted-latency-producer"
    body_fields = PROMPT_FIELDS | frozenset(OUTPUT_LIMIT_FIELDS)  # prompt tokens; TPOT over the output
    Parameters = PredictedLatencyParameters

    def filter(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        return endpoints

    def setup(self, handle: PluginHandle) -> None:
        p = self.params
        self.ttft = LatencyModel(len(TTFT_FEATURES), p.min_samples, p.forgetting_factor)
        self.tpot = LatencyModel(len(TPOT_FEATURES), p.min_samples, p.forgetting_factor)
        self.prefill = InFlightLedger(LOST_AFTER_S, handle.clock)  # uncached prompt tokens awaiting a first token
        self.new = InFlightLedger(LOST_AFTER_S, handle.clock)  # requests awaiting their first token
        self.running = InFlightLedger(LOST_AFTER_S, handle.clock)  # requests awaiting their end
        self._pending: OrderedDict[str, _Pending] = OrderedDict()
        self._state_key = f"predicted-latency/{self.name}"
        self._hook_key = f"predicted-latency-hook/{self.name}/"
        self.observed = {"ttft": 0, "tpot": 0}

    @property
    def clock(self) -> Callable[[], float]:
        return self.prefill.clock

    @clock.setter
    def clock(self, clock: Callable[[], float]) -> None:
        self.prefill.clock = self.new.clock = self.running.clock = clock

    # -- prediction (the hot path) ----------------------------------------------------------------

    def predictions(
        self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]
    ) -> dict[str, Prediction] | None:
        """Predicted latency per endpoint name, or None while the TTFT model is cold (once per cycle)."""
        cached = cycle_state.read(self._state_key)
        if cached is not None:
            return cached or None
        out: dict[str, Prediction] = {}
        if self.ttft.warm:
            # The hot path: one dot product per endpoint, inlined (the features of _ttft_features /
            # _tpot_features, in their order), about 1 µs an endpoint.
            prompt = prompt_tokens(request)
            matches = cycle_state.attribute_by_endpoint(PREFIX_MATCH_KEY)
            prefill, new, running = self.prefill.totals(), self.new.totals(), self.running.totals()
            ttft_ready, ttft_pool = self.ttft.weights()  # type: ignore[misc] (warm)
            tpot_weights = self.tpot.weights()
            tpot_ready, tpot_pool = tpot_weights if tpot_weights is not None else ({}, None)
            for ep in endpoints:
                name, m = ep.name, ep.metrics
                match = matches.get(name) if matches else None
                uncached = prompt if match is None else max(0, prompt - match.match_tokens)
                a = ttft_ready.get(name, ttft_pool).theta
                ttft = (
                    a[0] + a[1] * m.waiting_queue_size + a[2] * m.running_requests_size
                    + a[3] * m.kv_cache_usage_percent + a[4] * uncached / 1000.0
                    + a[5] * prefill.get(name, 0) / 1000.0 + a[6] * new.get(name, 0)
                )  # fmt: skip
                tpot = None
                if tpot_pool is not None:
                    b = tpot_ready.get(name, tpot_pool).theta
                    tpot = b[0] + b[1] * m.running_requests_size + b[2] * m.kv_cache_usage_percent
                    tpot = max(0.0, tpot + b[3] * running.get(name, 0))
                out[name] = Prediction(max(0.0, ttft), tpot)
        cycle_state.write(self._state_key, out)
        return out or None

    # -- learning (relayed by the consumers, once per event) ---------------------------------------

    def _first_time(self, request: LLMRequest, event: str) -> bool:
        key: DataKey[bool] = DataKey(self._hook_key + event)
        if request.derived.get(key):
            return False
        request.derived.put(key, True)
        return True

    def learn_decision(self, request: LLMRequest, result: SchedulingResult) -> None:
        if not self._first_time(request, "pre"):
            return
        target = prefill_target(result)
        if target is None:
            return
        rid, name = request.request_id, target.name
        uncached = uncached_tokens(prompt_tokens(request), target.attributes.get(PREFIX_MATCH_KEY))
        pending = _Pending(
            name,
            _ttft_features(target, uncached, self.prefill.totals().get(name, 0), self.new.totals().get(name, 0)),
            _tpot_features(target, self.running.totals().get(name, 0)),
            self.clock(),
            output_tokens(request),
        )
        self._expire(pending.sent_at)
        self._pending.pop(rid, None)
        self._pending[rid] = pending
        self.prefill.add(rid, [(name, uncached)])
        self.new.add(rid, [(name, 1)])
        self.running.add(rid, [(name, 1)])

    def learn_first_token(self, request: LLMRequest) -> None:
        if not self._first_time(request, "first"):
            return
        rid = request.request_id
        pending = self._pending.get(rid)
        self.prefill.release(rid)
        self.new.release(rid)
        if pending is None or pending.first_at is not None:
            return
        pending.first_at = self.clock()
        self.ttft.observe(pending.endpoint, pending.ttft_x, (pending.first_at - pending.sent_at) * 1000.0)
        self.observed["ttft"] += 1

    def learn_complete(self, request: LLMRequest) -> None:
        if not self._first_time(request, "done"):
            return
        rid = request.request_id
        pending = self._pending.pop(rid, None)
        for ledger in (self.prefill, self.new, self.running):
            ledger.release(rid)
        if pending is None or pending.first_at is None or pending.output_tokens < 2:
            return
        gap = (self.clock() - pending.first_at) * 1000.0 / (pending.output_tokens - 1)
        self.tpot.observe(pending.endpoint, pending.tpot_x, gap)
        self.observed["tpot"] += 1

    def _expire(self, now: float) -> None:
        while self._pending:
            rid, oldest = next(iter(self._pending.items()))
            if now - oldest.sent_at < LOST_AFTER_S:
                break
            del self._pending[rid]

    def info(self) -> dict:
        return {
            "observed": dict(self.observed),
            "endpoints": len(self.ttft.endpoints),
            "warm": self.ttft.warm,
            "pending": len(self._pending),
        }


def _ttft_features(ep: Endpoint, uncached: int, inflight_prefill: int, inflight_new: int) -> list[float]:
    m = ep.metrics
    return [
        1.0, float(m.waiting_queue_size), float(m.running_requests_size), m.kv_cache_usage_percent,
        uncached / 1000.0, inflight_prefill / 1000.0, float(inflight_new),
    ]  # fmt: skip


def _tpot_features(ep: Endpoint, inflight: int) -> list[float]:
    m = ep.metrics
    return [1.0, float(m.running_requests_size), m.kv_cache_usage_percent, float(inflight)]


class PredictorConsumer(PreRequest, ResponseFirstToken, ResponseComplete):
    """Mixin for the plugins that read a `predicted-latency-producer`: finds it (`predictorName`)
    and relays the hooks to it (the producer itself is in no profile, so gets no hooks)."""

    predictor: PredictedLatencyProducer

    def find_predictor(self, handle: PluginHandle, name: str) -> None:
        if not name and PredictedLatencyProducer.type_name in handle.plugin_names():
            name = PredictedLatencyProducer.type_name
        if not name:
            self.predictor = PredictedLatencyProducer()  # a private one (built outside a config)
        else:
            self.predictor = handle.plugin_of_type(name, PredictedLatencyProducer, "predictorName")

    @property
    def clock(self) -> Callable[[], float]:
        return self.predictor.clock

    @clock.setter
    def clock(self, clock: Callable[[], float]) -> None:
        self.predictor.clock = clock

    def pre_request(self, request: LLMRequest, result: SchedulingResult) -> None:
        self.predictor.learn_decision(request, result)

    def response_first_token(self, request: LLMRequest, endpoint_name: str) -> None:
        self.predictor.learn_first_token(request)

    def response_complete(self, request: LLMRequest, endpoint_name: str) -> None:
        self.predictor.learn_complete(request)


class PredictorParameters(Parameters):
    predictor_name: str = Field(default="", alias="predictorName")
