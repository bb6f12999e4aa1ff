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
from scheduler.plugins.support.prefill_ledger import PrefillLedger, PrefillLedgerParameters, backlog_scores
from scheduler.registry import register
from scheduler.types import Endpoint, LLMRequest


@register
class PrefillBacklogScorer(PrefillLedger, Scorer):
    type_name = "prefill-backlog-scorer"
    category = ScorerCategory.DISTRIBUTION
    Parameters = PrefillLedgerParameters

    def score(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> dict[Endpoint, float]:
        return backlog_scores(cycle_state, request, endpoints, self.backlog() if endpoints else {})
