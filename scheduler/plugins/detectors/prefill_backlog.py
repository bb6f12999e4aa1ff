"""`prefill-backlog-detector` (Ray EPP): the pool is saturated for sheddable traffic when the prompt
work this router has sent and not yet seen answered averages `maxBacklogTokens` or more per
endpoint (scheduler/plugins/support/prefill_ledger.py).

Why: GIE's utilization detector sheds sheddable requests only once the scraped queues or KV cache
cross their lines, so under overload the pool runs *at* saturation, and an FCFS engine makes
critical requests wait behind the sheddable ones already admitted. Prompt tokens queued for
prefill are what a new request's time to first token waits for, and the ledger sees them at once,
so this line holds the pool below the knee instead of on it. `maxBacklogTokens` trades sheddable
goodput for critical latency: about one typical prompt per endpoint (the default, 1,024) keeps the
queue short; docs/BENCHMARKS.md ("Priority under overload") measures the trade.

Declare it in `plugins` (it need not be in a profile); the gateway and the benchmark router ask
it, with GIE's utilization detector, before scheduling a sheddable request (scheduler/admission.py).
With several gateway replicas each replica's instance counts its own traffic: divide the line by
the replica count."""

from __future__ import annotations

from pydantic import Field

from scheduler.interfaces import SaturationDetector
from scheduler.plugins.support.prefill_ledger import PrefillLedger, PrefillLedgerParameters
from scheduler.registry import register
from scheduler.types import Endpoint


class PrefillBacklogDetectorParameters(PrefillLedgerParameters):
    max_backlog_tokens: int = Field(default=1024, alias="maxBacklogTokens", gt=0)


@register
class PrefillBacklogDetector(PrefillLedger, SaturationDetector):
    type_name = "prefill-backlog-detector"
    Parameters = PrefillBacklogDetectorParameters

    def saturation(self, endpoints: list[Endpoint]) -> float:
        """Average backlog per endpoint over the line; 1.0 (saturated) for no endpoints."""
        if not endpoints:
            return 1.0
        backlog = self.backlog()
        total = sum(backlog.get(ep.name, 0) for ep in endpoints)
        return total / len(endpoints) / self.params.max_backlog_tokens

    def is_pool_saturated(self, endpoints: list[Endpoint]) -> bool:
        return self.saturation(endpoints) >= 1.0
