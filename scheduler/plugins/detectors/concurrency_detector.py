"""`concurrency-detector` (llm-d's pkg/epp/framework/plugins/flowcontrol/saturationdetector/concurrency/
detector.go): saturation from requests (or tokens) in flight rather than scraped metrics, so a burst
counts before the next scrape.

`concurrencyMode`: `requests` (default): pool saturation = requests in flight / (endpoints *
maxConcurrency); `tokens`: tokens in flight / (endpoints * maxTokenConcurrency); `hybrid`: the mean
over endpoints of the larger of the two ratios. No endpoints is saturation 1. The pool is saturated
at 1 or more (sheddable requests get 429). As a filter it keeps endpoints under
capacity * (1 + headroom) in the mode's dimension(s), with no fail-open (llm-d's behaviour).

Counts are `inflight-load-producer`'s (scheduler/plugins/support/inflight_load_count.py). As a filter
it reads them under INFLIGHT_LOAD, written for the profile run (none when the producer failed: it
then keeps every endpoint). As a detector it is asked at admission and by flow control, outside any
profile run, so no cycle state reaches it: it reads the producer's live counts through their
read-only view (`inflight_counts_for`), the producer running in the same gateway replica and
counting that replica's traffic (as prefill-backlog-detector does); built outside a config, it sees
no requests in flight."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from scheduler.cycle_state import CycleState
from scheduler.interfaces import Filter, Parameters, PluginHandle, SaturationDetector
from scheduler.plugins.support.inflight_load_count import INFLIGHT_LOAD, inflight_counts_for
from scheduler.registry import register
from scheduler.types import Endpoint, LLMRequest


class ConcurrencyDetectorParameters(Parameters):
    concurrency_mode: Literal["requests", "tokens", "hybrid"] = Field(default="requests", alias="concurrencyMode")
    max_concurrency: int = Field(default=100, alias="maxConcurrency", gt=0)
    max_token_concurrency: int = Field(default=1_000_000, alias="maxTokenConcurrency", gt=0)
    headroom: float = Field(default=0.0, ge=0.0)


@register
class ConcurrencyDetector(Filter, SaturationDetector):
    type_name = "concurrency-detector"
    Parameters = ConcurrencyDetectorParameters
    consumes = (INFLIGHT_LOAD,)

    def setup(self, handle: PluginHandle) -> None:
        self.counts = inflight_counts_for(handle)
        p = self.params
        self._request_limit = int(p.max_concurrency * (1.0 + p.headroom))
        self._token_limit = int(p.max_token_concurrency * (1.0 + p.headroom))

    def saturation(self, endpoints: list[Endpoint]) -> float:
        if not endpoints:
            return 1.0
        if self.counts is None:
            return 0.0
        p, requests, tokens = self.params, self.counts.requests(), self.counts.tokens()
        if p.concurrency_mode == "hybrid":
            return sum(
                max(requests.get(ep.name, 0) / p.max_concurrency, tokens.get(ep.name, 0) / p.max_token_concurrency)
                for ep in endpoints
            ) / len(endpoints)
        if p.concurrency_mode == "tokens":
            return sum(tokens.get(ep.name, 0) for ep in endpoints) / (len(endpoints) * p.max_token_concurrency)
        return sum(requests.get(ep.name, 0) for ep in endpoints) / (len(endpoints) * p.max_concurrency)

    def is_pool_saturated(self, endpoints: list[Endpoint]) -> bool:
        return self.saturation(endpoints) >= 1.0

    def filter(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        load = cycle_state.get(INFLIGHT_LOAD)
        if load is None:
            return endpoints
        mode, requests, tokens = self.params.concurrency_mode, load.requests, load.tokens
        check_requests, check_tokens = mode in ("requests", "hybrid"), mode in ("tokens", "hybrid")
        return [
            ep
            for ep in endpoints
            if (not check_requests or requests.get(ep.name, 0) < self._request_limit)
            and (not check_tokens or tokens.get(ep.name, 0) < self._token_limit)
        ]
