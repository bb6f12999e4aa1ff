"""`session-affinity-filter` (llm-d): the hard form of `session-affinity-scorer`: when the
request's session points at a candidate, only that candidate passes; otherwise (no session, a
stale token whose endpoint is gone) every candidate passes and normal scoring decides. Writes
the same response header (scheduler/plugins/support/session.py)."""

from __future__ import annotations

from collections.abc import Mapping

from scheduler.cycle_state import CycleState
from scheduler.interfaces import Filter, PluginHandle, PreRequest, ResponseHeader
from scheduler.plugins.support.session import SessionAffinity, SessionAffinityParameters
from scheduler.registry import register
from scheduler.types import Endpoint, LLMRequest, SchedulingResult


@register
class SessionAffinityFilter(Filter, PreRequest, ResponseHeader):
    type_name = "session-affinity-filter"
    Parameters = SessionAffinityParameters

    def setup(self, handle: PluginHandle) -> None:
        self.session = SessionAffinity(self.params, place_unbound=False)

    def filter(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        preferred = self.session.preferred(request, endpoints)
        return endpoints if preferred is None else [preferred]

    def pre_request(self, request: LLMRequest, result: SchedulingResult) -> None:
        self.session.record(request, result)

    def response_headers(self, request: LLMRequest, result: SchedulingResult) -> Mapping[str, str]:
        return self.session.response_headers(result)
