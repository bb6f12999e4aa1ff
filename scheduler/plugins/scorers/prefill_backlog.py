"""`prefill-backlog-scorer` (Ray EPP): prefer the endpoint that would reach this request's first
token soonest, by this scheduler's own count of prompt work it has sent and not yet seen answered.

Why: a model server prefills in FCFS order under a per-step token budget, so a request's time to
first token grows with the uncached prompt tokens queued ahead of it on that server. Scraped
metrics show that queue 50 ms late and only as a request count, so every request between two
scrapes lands on the server that looked emptiest (herding); the router's own ledger is exact.

The cost of an endpoint is its backlog — the estimated uncached prompt tokens of requests sent to
it whose first token has not arrived (PreRequest adds, ResponseFirstToken or ResponseComplete
removes, `requestTimeout` drops the lost) — plus this request's own uncached tokens there, which
the `prefix-cache-scorer` (when it ran earlier in the profile) tells through the endpoint's
PrefixCacheMatchInfo. Tokens are estimated as GIE does: 4 characters a token. Scores are min-max
over the candidates: the cheapest scores 1, the dearest 0, all equal score 1.

In P/D the prompt work is counted on the prefill target (the decode target prefills nothing).
Ledgers are per plugin instance: in the Ray path, per profile actor, each told every event."""

from __future__ import annotations

from typing import Annotated

from pydantic import BeforeValidator, Field

from scheduler.cycle_state import CycleState
from scheduler.duration import duration_seconds
from scheduler.inflight import InFlightLedger, LedgerClock
from scheduler.interfaces import Parameters, PreRequest, ResponseComplete, ResponseFirstToken, Scorer, ScorerCategory
from scheduler.prefix.hashing import AVERAGE_CHARS_PER_TOKEN
from scheduler.prefix.match_info import PREFIX_MATCH_KEY, PrefixCacheMatchInfo
from scheduler.registry import register
from scheduler.types import Endpoint, LLMRequest, SchedulingResult

PREFILL_PROFILE = "prefill"  # GIE's / llm-d's prefill profile name when the handler names none
Seconds = Annotated[float, BeforeValidator(duration_seconds)]


class PrefillBacklogParameters(Parameters):
    # A Go duration string in config ("30s", "2m"); seconds once loaded.
    request_timeout: Seconds = Field(default=120.0, alias="requestTimeout", gt=0.0)


def prompt_tokens(request: LLMRequest) -> int:
    """The prompt's length in estimated tokens (at least 1)."""
    return max(1, len(request.prompt_text()) // AVERAGE_CHARS_PER_TOKEN)


def uncached_tokens(total: int, match: PrefixCacheMatchInfo | None) -> int:
    """The prompt tokens a server still has to prefill, given what the prefix scorer thinks it holds."""
    return total if match is None else max(0, total - match.match_tokens)


@register
class PrefillBacklogScorer(LedgerClock, Scorer, PreRequest, ResponseFirstToken, ResponseComplete):
    type_name = "prefill-backlog-scorer"
    category = ScorerCategory.DISTRIBUTION
    Parameters = PrefillBacklogParameters

    def setup(self, handle) -> None:
        self.ledger = InFlightLedger(self.params.request_timeout)

    def backlog(self) -> dict[str, int]:
        """Estimated uncached prompt tokens awaiting their first token, per endpoint name."""
        return self.ledger.totals()

    def score(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> dict[Endpoint, float]:
        backlog = self.backlog()
        total = prompt_tokens(request)
        matches = cycle_state.attribute_by_endpoint(PREFIX_MATCH_KEY)
        costs = {ep: backlog.get(ep.name, 0) + uncached_tokens(total, matches.get(ep.name)) for ep in endpoints}
        if not costs:
            return {}
        low, high = min(costs.values()), max(costs.values())
        if high == low:
            return dict.fromkeys(costs, 1.0)
        span = high - low
        return {ep: (high - cost) / span for ep, cost in costs.items()}

    def pre_request(self, request: LLMRequest, result: SchedulingResult) -> None:
        target = _prefill_target(result)
        if target is not None:
            tokens = uncached_tokens(prompt_tokens(request), target.attributes.get(PREFIX_MATCH_KEY))
            self.ledger.add(request.request_id, [(target.name, tokens)])

    def response_first_token(self, request: LLMRequest, endpoint_name: str) -> None:
        self.ledger.release(request.request_id)

    def response_complete(self, request: LLMRequest, endpoint_name: str) -> None:
        self.ledger.release(request.request_id)


def _prefill_target(result: SchedulingResult) -> Endpoint | None:
    """Where the prompt is prefilled: the prefill profile's target in P/D, else the primary's."""
    for name in (result.prefill_profile_name or PREFILL_PROFILE, result.primary_profile_name):
        profile = result.profile_results.get(name) if name else None
        if profile is not None and profile.target_endpoints:
            return profile.target_endpoints[0]
    return None
