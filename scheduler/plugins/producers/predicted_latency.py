"""`predicted-latency-producer` (llm-d-router pkg/epp/framework/plugins/.../predictedlatency): per
endpoint of the profile's pool, this request's predicted TTFT and TPOT, written under its
PREDICTED_LATENCY key (scheduler/plugins/support/latency_prediction.py) before the filters, for
`latency-scorer`, `slo-headroom-tier-filter`, `latency-slo-admitter` and `prefix-cache-affinity-filter`,
which read the key of the producer they name (`predictorName`, default this type's name).

llm-d asks trained models in sidecars; here the model is in the plugin (scheduler/plugins/support/
latency_model.py: RLS per endpoint with a pool-wide prior), learned from its own lifecycle hooks:

* PreRequest: the target's features at decision time (scraped waiting / running / KV use, this
  request's uncached prompt tokens there by the prefix producer's match, and this producer's own
  ledger of prompt tokens and requests sent there whose first token has not come), and the time.
* ResponseFirstToken: TTFT = now - decision time, one observation for the TTFT model.
* ResponseComplete: TPOT = (now - first token) / (output tokens - 1), the output length taken as
  the client's `max_tokens` (the gateway sees no token count in the hook); one TPOT observation.

Producing: while the TTFT model is cold nothing is written (the consumers step aside). Warm, every
request gets its predictions, whatever its headers: the SLO consumers read the request's
`x-slo-*` / `x-prediction-based-scheduling` headers themselves, and the affinity filter's TTFT gate
reads the predictions whatever they say. It runs after the profile's prefix producer when there is
one (`runs_after`), whose match it reads through the endpoints' PREFIX_MATCH_KEY attribute.

In the Ray path the state lives in each profile actor (every replica's events reach it), as the
prefix index does; each shard of a sharded profile learns from its own share of the traffic."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pydantic import Field

from scheduler.body_fields import OUTPUT_LIMIT_FIELDS, PROMPT_FIELDS
from scheduler.cycle_state import CycleState
from scheduler.interfaces import (
    Parameters,
    PluginHandle,
    PreRequest,
    Producer,
    ResponseComplete,
    ResponseFirstToken,
)
from scheduler.plugins.support.inflight_ledger import InFlightLedger
from scheduler.plugins.support.latency_model import TPOT_FEATURES, TTFT_FEATURES, LatencyModel
from scheduler.plugins.support.latency_prediction import PREDICTED_LATENCY, Prediction
from scheduler.plugins.support.prefill_ledger import prefill_target, prompt_tokens, uncached_tokens
from scheduler.plugins.support.prefix import PREFIX_MATCH_INFO, PREFIX_MATCH_KEY, PrefixCacheMatchInfo
from scheduler.registry import register
from scheduler.types import Endpoint, LLMRequest, SchedulingResult

LOST_AFTER_S = 600.0


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
class PredictedLatencyProducer(Producer, PreRequest, ResponseFirstToken, ResponseComplete):
    """Listed in a profile (as llm-d's samples do) or only under `plugins`: either way the profiles
    whose plugins read its key run it."""

    type_name = "predicted-latency-producer"
    body_fields = PROMPT_FIELDS | frozenset(OUTPUT_LIMIT_FIELDS)  # prompt tokens; TPOT over the output
    Parameters = PredictedLatencyParameters
    runs_after = (PREFIX_MATCH_INFO.name,)  # the prefix producer's match, when the profile runs one

    def setup(self, handle: PluginHandle) -> None:
        p = self.params
        self.ttft = LatencyModel(len(TTFT_FEATURES), p.min_samples, p.forgetting_factor)
        self.tpot = LatencyModel(len(TPOT_FEATURES), p.min_samples, p.forgetting_factor)
        self.prefill = InFlightLedger(LOST_AFTER_S, handle.clock)  # uncached prompt tokens awaiting a first token
        self.new = InFlightLedger(LOST_AFTER_S, handle.clock)  # requests awaiting their first token
        self.running = InFlightLedger(LOST_AFTER_S, handle.clock)  # requests awaiting their end
        self._pending: OrderedDict[str, _Pending] = OrderedDict()
        self.produces = (PREDICTED_LATENCY.of(self.name),)
        self.observed = {"ttft": 0, "tpot": 0}

    @property
    def clock(self) -> Callable[[], float]:
        return self.prefill.clock

    @clock.setter
    def clock(self, clock: Callable[[], float]) -> None:
        self.prefill.clock = self.new.clock = self.running.clock = clock

    # -- prediction (the hot path) ----------------------------------------------------------------

    def produce(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> None:
        """This request's predictions for `endpoints`; nothing while the TTFT model is cold."""
        predicted = self.predict(request, endpoints, cycle_state.attribute_by_endpoint(PREFIX_MATCH_KEY))
        if predicted:
            cycle_state.put(self.produces[0], predicted)

    def predict(
        self, request: LLMRequest, endpoints: list[Endpoint], matches: Mapping[str, PrefixCacheMatchInfo] | None = None
    ) -> dict[str, Prediction]:
        """Predicted latency per endpoint name (`matches`: the prefix match per endpoint name); empty
        while the TTFT model is cold."""
        out: dict[str, Prediction] = {}
        if self.ttft.warm:
            # The hot path: one dot product per endpoint, inlined (the features of _ttft_features /
            # _tpot_features, in their order), about 1 µs an endpoint.
            prompt = prompt_tokens(request)
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
        return out

    # -- learning: its own lifecycle hooks, once per event ----------------------------------------

    def pre_request(self, request: LLMRequest, result: SchedulingResult) -> None:
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

    def response_first_token(self, request: LLMRequest, endpoint_name: str) -> None:
        rid = request.request_id
        pending = self._pending.get(rid)
        self.prefill.release(rid)
        self.new.release(rid)
        if pending is None or pending.first_at is not None:
            return
        pending.first_at = self.clock()
        self.ttft.observe(pending.endpoint, pending.ttft_x, (pending.first_at - pending.sent_at) * 1000.0)
        self.observed["ttft"] += 1

    def response_complete(self, request: LLMRequest, endpoint_name: str) -> None:
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
