"""The prompt work a router has sent to each endpoint and not yet seen answered: estimated uncached
prompt tokens of requests whose first token has not arrived. What `prefill-backlog-scorer` ranks
endpoints by and `prefill-backlog-detector` admits by (a mixin of theirs, not a plugin).

PreRequest adds a request's uncached tokens to its prefill target (the prefill profile's target in
P/D, else the primary's), ResponseFirstToken or ResponseComplete removes them, `requestTimeout`
drops the lost. Tokens are estimated as GIE does, 4 characters a token; the cached part is what the
`prefix-cache-scorer` (when it ran in the profile) published as the target's PrefixCacheMatchInfo.
Ledgers are per plugin instance: in the Ray path, per profile actor, each told every event."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated

from pydantic import BeforeValidator, Field

from scheduler.body_fields import PROMPT_FIELDS
from scheduler.cycle_state import CycleState
from scheduler.duration import duration_seconds
from scheduler.interfaces import Parameters, PluginHandle, ResponseComplete, ResponseFirstToken, TentativePreRequest
from scheduler.plugins.support.inflight_ledger import InFlightLedger, LedgerClock
from scheduler.plugins.support.prefix.hashing import AVERAGE_CHARS_PER_TOKEN
from scheduler.plugins.support.prefix.match_info import PREFIX_MATCH_KEY, PrefixCacheMatchInfo
from scheduler.types import Endpoint, LLMRequest, SchedulingResult

PREFILL_PROFILE = "prefill"  # GIE's / llm-d's prefill profile name when the handler names none
Seconds = Annotated[float, BeforeValidator(duration_seconds)]


class PrefillLedgerParameters(Parameters):
    # A Go duration string in config ("30s", "2m"); seconds once loaded.
    request_timeout: Seconds = Field(default=120.0, alias="requestTimeout", gt=0.0)


def prompt_tokens(request: LLMRequest) -> int:
    """The prompt's length in estimated tokens (at least 1)."""
    return max(1, len(request.prompt_text()) // AVERAGE_CHARS_PER_TOKEN)


def uncached_tokens(total: int, match: PrefixCacheMatchInfo | None) -> int:
    """The prompt tokens a server still has to prefill, given what the prefix scorer thinks it holds."""
    return total if match is None else max(0, total - match.match_tokens)


def prefill_target(result: SchedulingResult) -> Endpoint | None:
    """Where the prompt is prefilled: the prefill profile's target in P/D, else the primary's."""
    for name in (result.prefill_profile_name or PREFILL_PROFILE, result.primary_profile_name):
        profile = result.profile_results.get(name) if name else None
        if profile is not None and profile.target_endpoints:
            return profile.target_endpoints[0]
    return None


def prompt_sent(request: LLMRequest, result: SchedulingResult) -> tuple[str, int] | None:
    """(prefill target's name, uncached prompt tokens sent there) for a scheduled request."""
    target = prefill_target(result)
    if target is None:
        return None
    return target.name, uncached_tokens(prompt_tokens(request), target.attributes.get(PREFIX_MATCH_KEY))


def backlog_scores(
    cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint], backlog: Mapping[str, float]
) -> dict[Endpoint, float]:
    """Min-max scores of cost = backlog + this request's own uncached tokens at each endpoint (what
    the `prefix-cache-scorer`, when it ran earlier in the profile, says it holds): the cheapest 1,
    the dearest 0, all equal 1."""
    if not endpoints:
        return {}
    total = prompt_tokens(request)
    # Per endpoint only C-level work (fromkeys, min, max); Python work per busy or matched endpoint.
    costs: dict[Endpoint, float] = dict.fromkeys(endpoints, total)
    matches = cycle_state.attribute_by_endpoint(PREFIX_MATCH_KEY)
    if backlog or matches:
        by_name = {ep.name: ep for ep in endpoints}
        for name, tokens in backlog.items():
            ep = by_name.get(name)
            if ep is not None:
                costs[ep] += tokens
        for name, match in matches.items():
            if match.match_blocks and (ep := by_name.get(name)) is not None:
                costs[ep] -= total - uncached_tokens(total, match)
    low, high = min(costs.values()), max(costs.values())
    if high == low:
        return dict.fromkeys(costs, 1.0)
    span = high - low
    return {ep: (high - cost) / span for ep, cost in costs.items()}


class PrefillLedger(LedgerClock, TentativePreRequest, ResponseFirstToken, ResponseComplete):
    """Mixin: the hooks that keep `self.ledger`; `backlog()` reads it."""

    body_fields = PROMPT_FIELDS  # the prompt's length

    def setup(self, handle: PluginHandle) -> None:
        self.ledger = InFlightLedger(self.params.request_timeout, handle.clock)

    def backlog(self) -> dict[str, int]:
        """Estimated uncached prompt tokens awaiting their first token, per endpoint name."""
        return self.ledger.totals()

    def pre_request(self, request: LLMRequest, result: SchedulingResult) -> None:
        sent = prompt_sent(request, result)
        if sent is not None:
            self.ledger.add(request.request_id, [sent])

    def withdraw(self, request: LLMRequest) -> None:
        self.ledger.release(request.request_id)

    def response_first_token(self, request: LLMRequest, endpoint_name: str) -> None:
        self.ledger.release(request.request_id)

    def response_complete(self, request: LLMRequest, endpoint_name: str) -> None:
        self.ledger.release(request.request_id)
