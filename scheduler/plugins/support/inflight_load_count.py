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
LOST_AFTER_S so a lost response can not hold an endpoint forever.

What consumers read: the producer writes `INFLIGHT_LOAD`, an `InFlightSnapshot` of the counts and
of what this request would add, in each profile run; a saturation detector asked at admission
(no profile run, no cycle state) reads the producer's `InFlightCounts` view instead."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from scheduler.body_fields import OUTPUT_LIMIT_FIELDS, PROMPT_FIELDS
from scheduler.data_keys import DataKey
from scheduler.interfaces import PluginHandle, ResponseComplete, ResponseFirstToken, TentativePreRequest
from scheduler.plugins.support.inflight_ledger import InFlightLedger
from scheduler.plugins.support.prefill_ledger import prompt_tokens, uncached_tokens
from scheduler.plugins.support.prefix import PREFIX_MATCH_KEY, PrefixCacheMatchInfo
from scheduler.types import LLMRequest, SchedulingResult

PREFILL_PROFILE = "prefill"
LOST_AFTER_S = 600.0
PRODUCER = "inflight-load-producer"  # the producer's type name: its key's producer by default


@dataclass(slots=True, frozen=True)
class InFlightSnapshot:
    """The in-flight counts as one request's profile run sees them (llm-d's InFlightLoad per endpoint
    and UncachedRequestTokens): requests and tokens per endpoint name (endpoints with none absent),
    and the tokens this request would add on an endpoint, its prompt less what that endpoint has
    cached plus the output estimate (`request_tokens`)."""

    requests: Mapping[str, int]
    tokens: Mapping[str, int]
    prompt_tokens: int
    output_tokens: int

    def request_tokens(self, match: PrefixCacheMatchInfo | None) -> int:
        """The tokens this request adds on an endpoint with this prefix-cache match."""
        return uncached_tokens(self.prompt_tokens, match) + self.output_tokens


INFLIGHT_LOAD: DataKey[InFlightSnapshot] = DataKey("inflight-load", PRODUCER)


class InFlightCounts(Protocol):
    """The live counts, read-only: what a detector asked outside a profile run reads."""

    def requests(self) -> dict[str, int]: ...
    def tokens(self) -> dict[str, int]: ...


@runtime_checkable
class InFlightLoadSource(Protocol):
    """A plugin that counts requests in flight and shows its counts (the in-flight load producer)."""

    def inflight_counts(self) -> InFlightCounts: ...


def inflight_counts_for(handle: PluginHandle, name: str = PRODUCER) -> InFlightCounts | None:
    """The live counts of the producer called `name` (made with its defaults when the config
    declares none), for a plugin that reads them outside a profile run; None for a plugin built
    outside a config (it then sees no requests in flight)."""
    try:
        plugin = handle.plugin(name)
    except KeyError:
        return None
    if not isinstance(plugin, InFlightLoadSource):
        raise ValueError(f"the plugin called {name!r} is a {plugin.type_name}, which counts no requests in flight")
    return plugin.inflight_counts()


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

    def snapshot(self, request: LLMRequest) -> InFlightSnapshot:
        """The counts now, and this request's prompt and (with `addEstimatedOutputTokens`) output estimate."""
        return InFlightSnapshot(self.requests(), self.tokens(), *self._own_tokens(request))

    def _own_tokens(self, request: LLMRequest) -> tuple[int, int]:
        prompt = prompt_tokens(request)
        return prompt, self.estimate.output_tokens(request, prompt) if self.estimate.add_output else 0

    def add(self, request: LLMRequest, result: SchedulingResult) -> None:
        rid = request.request_id
        early_requests, end_requests, early_tokens, end_tokens = [], [], [], []
        this = InFlightSnapshot({}, {}, *self._own_tokens(request))
        for profile, run in result.profile_results.items():
            if run is None or not run.target_endpoints:
                continue
            target = run.target_endpoints[0]
            tokens = this.request_tokens(target.attributes.get(PREFIX_MATCH_KEY))
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
    """Mixin for the plugin that keeps an `InFlightLoad` as `self.load`: the lifecycle hooks feed it,
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
