"""`prefill-backlog-scorer` (Ray EPP): prefer the endpoint that would reach this request's first
token soonest, by this router's own ledger of prompt work sent and not yet answered
(scheduler/plugins/support/prefill_ledger.py).

Why: a model server prefills in FCFS order under a per-step token budget, so a request's time to
first token grows with the uncached prompt tokens queued ahead of it on that server. Scraped
metrics show that queue 50 ms late and only as a request count, so every request between two
scrapes lands on the server that looked emptiest (herding); the router's own ledger is exact.

The cost of an endpoint is its backlog plus this request's own uncached tokens there (what the
`prefix-cache-scorer`, when it ran earlier in the profile, says it holds). Scores are min-max over
the candidates: the cheapest scores 1, the dearest 0, all equal score 1."""

from __future__ import annotations

from scheduler.cycle_state import CycleState
from scheduler.interfaces import Scorer, ScorerCategory
from scheduler.plugins.support.prefill_ledger import (
    PrefillLedger,
    PrefillLedgerParameters,
    prompt_tokens,
    uncached_tokens,
)
from scheduler.plugins.support.prefix.match_info import PREFIX_MATCH_KEY
from scheduler.registry import register
from scheduler.types import Endpoint, LLMRequest


@register
class PrefillBacklogScorer(PrefillLedger, Scorer):
    type_name = "prefill-backlog-scorer"
    category = ScorerCategory.DISTRIBUTION
    Parameters = PrefillLedgerParameters

    def score(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> dict[Endpoint, float]:
        if not endpoints:
            return {}
        total = prompt_tokens(request)
        # Per endpoint only C-level work (fromkeys, min, max); Python work per busy or matched endpoint.
        costs = dict.fromkeys(endpoints, total)
        backlog = self.backlog()
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
