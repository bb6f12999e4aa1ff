"""In-flight requests and tokens per endpoint, counted as llm-d's `inflight-load-producer` counts them
(llm-d/llm-d-router pkg/epp/framework/plugins/requestcontrol/dataproducer/inflightload/producer.go,
token_estimator.go); what `token-load-scorer` and `concurrency-detector` read.

PreRequest adds, for the first target of every profile result, one request and its tokens: the
prompt's uncached part (the prefix-cache match on that target discounted), plus with
`addEstimatedOutputTokens` an output estimate, min(round(prompt * outputRatio), the client's
max_tokens / max_completion_tokens / max_output_tokens, maxEstimatedOutputTokens). The first token
releases the prefill target's request and tokens and, without the output estimate, every other
target's tokens (their prefill is done); the response's end releases the rest. The prompt counts
as characters / 4 (Ray EPP has no tokenizer). A request never answered is dropped after
LOST_AFTER_S so a lost response can not hold an endpoint forever."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from scheduler.body_fields import OUTPUT_LIMIT_FIELDS, PROMPT_FIELDS
from scheduler.interfaces import ResponseComplete, ResponseFirstToken, TentativePreRequest
from scheduler.plugins.support.inflight_ledger import InFlightLedger
from scheduler.plugins.support.prefill_ledger import prompt_tokens, uncached_tokens
from scheduler.plugins.support.prefix import PREFIX_MATCH_KEY, PrefixCacheMatchInfo
from scheduler.types import LLMRequest, SchedulingResult

PREFILL_PROFILE = "prefill"
LOST_AFTER_S = 600.0


@dataclass(slots=True, frozen=True)
class LoadEstimate:
    add_output: bool = False
    output_ratio: float = 1.5
    max_output: int | None = None

    def output_tokens(self, request: LLMRequest, prompt: int) -> int:
        estimate = round(prompt * self.output_ratio)
        for key in OUTPUT_LIMIT_FIELDS:
            limit = request.body.get(key)
            if type(limit) is int and 0 <= limit < estimate:
                estimate = limit
        if self.max_output is not None and self.max_output < estimate:
            estimate = self.max_output
        return estimate


class InFlightLoad:
    """The counts; one per consuming plugin instance (in the Ray path, per profile actor, and per
    gateway replica for a detector asked at admission)."""

    __slots__ = ("estimate", "requests_ledger", "tokens_ledger")

    def __init__(self, estimate: LoadEstimate, clock: Callable[[], float] = time.monotonic) -> None:
        self.estimate = estimate
        self.requests_ledger = InFlightLedger(LOST_AFTER_S, clock)
        self.tokens_ledger = InFlightLedger(LOST_AFTER_S, clock)

    @property
    def clock(self) -> Callable[[], float]:
        return self.requests_ledger.clock

    @clock.setter
    def clock(self, clock: Callable[[], float]) -> None:
        self.requests_ledger.clock = self.tokens_ledger.clock = clock

    def requests(self) -> dict[str, int]:
        return self.requests_ledger.totals()

    def tokens(self) -> dict[str, int]:
        return self.tokens_ledger.totals()

    def request_tokens(self, request: LLMRequest, match: PrefixCacheMatchInfo | None) -> int:
        """The tokens this request adds on an endpoint with this prefix-cache match: its uncached
        prompt, plus with `addEstimatedOutputTokens` the output estimate."""
        prompt = prompt_tokens(request)
        output = self.estimate.output_tokens(request, prompt) if self.estimate.add_output else 0
        return uncached_tokens(prompt, match) + output

    def add(self, request: LLMRequest, result: SchedulingResult) -> None:
        rid = request.request_id
        early_requests, end_requests, early_tokens, end_tokens = [], [], [], []
        for profile, run in result.profile_results.items():
            if run is None or not run.target_endpoints:
                continue
            target = run.target_endpoints[0]
            tokens = self.request_tokens(request, target.attributes.get(PREFIX_MATCH_KEY))
            prefill = profile == PREFILL_PROFILE
            (early_requests if prefill else end_requests).append((target.name, 1))
            (early_tokens if prefill or not self.estimate.add_output else end_tokens).append((target.name, tokens))
        self.requests_ledger.add(f"{rid}/first", early_requests)
        self.requests_ledger.add(f"{rid}/end", end_requests)
        self.tokens_ledger.add(f"{rid}/first", early_tokens)
        self.tokens_ledger.add(f"{rid}/end", end_tokens)

    def first_token(self, request: LLMRequest) -> None:
        self.requests_ledger.release(f"{request.request_id}/first")
        self.tokens_ledger.release(f"{request.request_id}/first")

    def complete(self, request: LLMRequest) -> None:
        for ledger in (self.requests_ledger, self.tokens_ledger):
            ledger.release(f"{request.request_id}/first")
            ledger.release(f"{request.request_id}/end")


class InFlightLoadHooks(TentativePreRequest, ResponseFirstToken, ResponseComplete):
    """Mixin for plugins that keep an `InFlightLoad` as `self.load`: the lifecycle hooks feed it,
    and its `clock` is the plugin's (re-pointed by tests and the simulation)."""

    body_fields = PROMPT_FIELDS | frozenset(OUTPUT_LIMIT_FIELDS)  # what the counts estimate by
    load: InFlightLoad

    @property
    def clock(self) -> Callable[[], float]:
        return self.load.clock

    @clock.setter
    def clock(self, clock: Callable[[], float]) -> None:
        self.load.clock = clock

    def pre_request(self, request: LLMRequest, result: SchedulingResult) -> None:
        self.load.add(request, result)

    def withdraw(self, request: LLMRequest) -> None:
        self.load.complete(request)

    def response_first_token(self, request: LLMRequest, endpoint_name: str) -> None:
        self.load.first_token(request)

    def response_complete(self, request: LLMRequest, endpoint_name: str) -> None:
        self.load.complete(request)
