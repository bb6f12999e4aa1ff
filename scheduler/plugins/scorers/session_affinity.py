"""`session-affinity-scorer` (llm-d): a soft preference for the endpoint of the request's session:
it scores 1, the others 0, so other scorers can still outweigh it. Both of llm-d's algorithms
(scheduler/plugins/support/session.py): the default writes `x-session-token` on every response
(a ResponseHeader hook, run by the gateway), which a client echoes to come back."""

from __future__ import annotations

from collections.abc import Mapping

from scheduler.cycle_state import CycleState
from scheduler.interfaces import PluginHandle, PreRequest, ResponseHeader, Scorer, ScorerCategory
from scheduler.plugins.support.session import SessionAffinity, SessionAffinityParameters
from scheduler.registry import register
from scheduler.types import Endpoint, LLMRequest, SchedulingResult


@register
class SessionAffinityScorer(Scorer, PreRequest, ResponseHeader):
    type_name = "session-affinity-scorer"
    category = ScorerCategory.AFFINITY
    Parameters = SessionAffinityParameters

    def setup(self, handle: PluginHandle) -> None:
        self.session = SessionAffinity(self.params, place_unbound=True)

    def score(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> dict[Endpoint, float]:
        preferred = self.session.preferred(request, endpoints)
        return {ep: 1.0 if ep is preferred else 0.0 for ep in endpoints}

    def pre_request(self, request: LLMRequest, result: SchedulingResult) -> None:
        self.session.record(request, result)

    def response_headers(self, request: LLMRequest, result: SchedulingResult) -> Mapping[str, str]:
        return self.session.response_headers(result)
