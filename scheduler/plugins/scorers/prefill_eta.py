"""`prefill-eta-scorer` (Ray EPP): prefer the endpoint with the least prompt work still ahead of
this request's first token, where each request this router sent there and has not yet seen
answered counts for the share of its predicted time to first token that is still to run.

Why not just the tokens in flight (`prefill-backlog-scorer`): a model server prefills what is
waiting at the start of its next step, so what delays a new request is the work that will share or
precede that step, not work sent long ago that is about to be answered. Counting a pending prompt
in full until its first token sends the next request to the endpoint holding the smallest pending
prompt, often one sent a moment ago, and two prefills then share a step, while the endpoint whose
bigger prompt is nearly done gets nothing.

Here an entry's weight falls linearly from 1 at send to `minWeight` (default 0) at its predicted
first token. The prediction is made at send: TTFT ~ a + b x (uncached kilotokens), fitted online
per endpoint from the TTFTs this router observed there (first token - decision; recursive least
squares, `scheduler/plugins/support/latency_model.py`, the pool's fit as a new endpoint's prior),
so a long prompt fades slower than a short one and, under overload, observed TTFTs grow and every
entry fades slower. Cold start: until the pool has seen `minSamples` first tokens nothing is
predicted and every entry counts in full, as in `prefill-backlog-scorer`; so it stays without
streamed responses, since a completion releases its entry but teaches nothing. Late endpoints: the
scorer keeps each endpoint's mean deviation of observed from predicted TTFT (Jacobson's estimator,
as TCP keeps for round trips); when an endpoint's oldest pending request is older than its
prediction + 4 deviations (TCP's retransmission rule), the endpoint is slower than its fit says,
and all its entries' horizons stretch by that age over its prediction, so the backlog of an
endpoint that stalls stays visible instead of fading. A pending prompt never fades below one token:
past its expected first token it is still unanswered, so its endpoint is mid-step and a new request
there waits for the rest of that step, where an endpoint with nothing pending starts it at once; of
two endpoints whose faded backlogs are equal, the one with nothing pending wins.

The cost of an endpoint is that faded backlog plus this request's own uncached tokens there (what
the `prefix-cache-scorer`, when it ran earlier in the profile, says it holds), min-max over the
candidates: the cheapest scores 1, the dearest 0, all equal score 1."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from operator import attrgetter

from pydantic import Field

from scheduler.body_fields import PROMPT_FIELDS
from scheduler.cycle_state import CycleState
from scheduler.interfaces import (
    PluginHandle,
    ResponseComplete,
    ResponseFirstToken,
    Scorer,
    ScorerCategory,
    TentativePreRequest,
)
from scheduler.plugins.support.latency_model import LatencyModel
from scheduler.plugins.support.prefill_ledger import PrefillLedgerParameters, backlog_scores, prompt_sent
from scheduler.registry import register
from scheduler.types import Endpoint, LLMRequest, SchedulingResult


class PrefillEtaParameters(PrefillLedgerParameters):
    # Weight of the newest residual in an endpoint's mean deviation (what "late" is measured in).
    ttft_smoothing: float = Field(default=0.1, alias="ttftSmoothing", gt=0.0, le=1.0)
    # The least share of its tokens a pending entry keeps once past its expected first token.
    min_weight: float = Field(default=0.0, alias="minWeight", ge=0.0, le=1.0)
    # First tokens the pool must have seen before TTFTs are predicted (until then entries count in full).
    min_samples: int = Field(default=16, alias="minSamples", ge=1)


# What a pending prompt counts for at the least, past its expected first token: it is unanswered,
# so its endpoint is still in the step that will answer it and a new request waits for the rest of
# that step; an endpoint with nothing pending does not. One token only breaks ties between equal
# faded backlogs (min-max scoring gives the tie-break the scorer's full weight when all else is
# equal, as at low load) and is negligible against any real backlog.
PENDING_FLOOR_TOKENS = 1.0

# A pending request: (endpoint name, uncached tokens, sent at, expected TTFT in s or None).
Pending = tuple[str, int, float, float | None]
_NAME = attrgetter("name")


@register
class PrefillEtaScorer(Scorer, TentativePreRequest, ResponseFirstToken, ResponseComplete):
    type_name = "prefill-eta-scorer"
    body_fields = PROMPT_FIELDS  # the prompt's length
    category = ScorerCategory.DISTRIBUTION
    Parameters = PrefillEtaParameters

    def setup(self, handle: PluginHandle) -> None:
        self.clock = handle.clock  # tests replace it
        self._lock = threading.Lock()
        # request id -> (endpoint name, uncached tokens, sent at, expected TTFT in s or None);
        # insertion order = send order. `_by_endpoint` holds the same entries per endpoint (send
        # order too), so a decision reads only its candidates' entries, not every request in flight.
        self._pending: OrderedDict[str, Pending] = OrderedDict()
        self._by_endpoint: dict[str, dict[str, Pending]] = {}
        # TTFT (ms) ~ bias + uncached kilotokens, per endpoint with the pool as prior.
        self.model = LatencyModel(2, min_samples=self.params.min_samples)
        self._deviation: dict[str, float] = {}  # endpoint name -> mean |observed - expected| (s)

    def expected_ttft(self, name: str, tokens: int) -> float | None:
        """Seconds to the first token of `tokens` uncached tokens sent to `name` (None while cold)."""
        ms = self.model.predict(name, [1.0, tokens / 1000])
        return None if ms is None else max(ms, 1.0) / 1000

    def backlog(self, names: Iterable[str] | None = None) -> dict[str, float]:
        """Pending uncached prompt tokens per endpoint (of `names`, default all), each weighted by
        its share still to run (at least one token per pending prompt)."""
        now = self.clock()
        out: dict[str, float] = {}
        with self._lock:
            self._expire(now)
            by_endpoint = self._by_endpoint
            for name in by_endpoint if names is None else names:
                entries = by_endpoint.get(name)
                if entries:
                    out[name] = self._faded(name, entries.values(), now)
        return out

    def _faded(self, name: str, entries: Iterable[Pending], now: float) -> float:
        """One endpoint's backlog: its entries (oldest first) faded by age."""
        floor = self.params.min_weight
        total = 0.0
        stretch = 0.0
        for _, tokens, sent, expected in entries:
            if not expected:
                total += tokens
                continue
            age = now - sent
            if not stretch:  # this endpoint's oldest predicted entry: is it late?
                late = age > expected + 4 * self._deviation.get(name, expected / 2)
                stretch = age / expected if late else 1.0
            total += max(tokens * max(floor, 1.0 - age / (expected * stretch)), PENDING_FLOOR_TOKENS)
        return total

    def score(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> dict[Endpoint, float]:
        backlog = self.backlog(map(_NAME, endpoints)) if endpoints else {}
        return backlog_scores(cycle_state, request, endpoints, backlog)

    def pre_request(self, request: LLMRequest, result: SchedulingResult) -> None:
        sent = prompt_sent(request, result)
        if sent is None:
            return
        with self._lock:
            expected = self.expected_ttft(*sent)
            self._drop(request.request_id)  # a retry: counted again, where it went now
            entry = (*sent, self.clock(), expected)
            self._pending[request.request_id] = entry
            self._by_endpoint.setdefault(entry[0], {})[request.request_id] = entry

    def response_first_token(self, request: LLMRequest, endpoint_name: str) -> None:
        now = self.clock()
        with self._lock:
            entry = self._drop(request.request_id)
            if entry is None:
                return
            name, tokens, sent, expected = entry
            observed = now - sent
            if expected is not None:
                residual = abs(observed - expected)
                deviation = self._deviation.get(name, residual)
                self._deviation[name] = deviation + self.params.ttft_smoothing * (residual - deviation)
            self.model.observe(name, [1.0, tokens / 1000], observed * 1000)

    def response_complete(self, request: LLMRequest, endpoint_name: str) -> None:
        with self._lock:
            self._drop(request.request_id)

    def withdraw(self, request: LLMRequest) -> None:
        self.response_complete(request, "")

    def _expire(self, now: float) -> None:
        timeout = self.params.request_timeout
        while self._pending:
            request_id, entry = next(iter(self._pending.items()))
            if entry[2] + timeout > now:
                break
            self._drop(request_id)

    def _drop(self, request_id: str) -> Pending | None:
        """Forget a pending request (both maps); its entry, or None when it was not pending."""
        entry = self._pending.pop(request_id, None)
        if entry is not None:
            entries = self._by_endpoint[entry[0]]
            del entries[request_id]
            if not entries:
                del self._by_endpoint[entry[0]]
        return entry
