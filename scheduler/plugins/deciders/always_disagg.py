"""`always-disagg-pd-decider` (llm-d): every request gets a remote prefill (tests, benchmarks, or
pools where prefill should never share a server with decode)."""

from __future__ import annotations

from scheduler.cycle_state import CycleState
from scheduler.interfaces import PDDecider
from scheduler.registry import register
from scheduler.types import Endpoint, LLMRequest


@register
class AlwaysDisaggPDDecider(PDDecider):
    type_name = "always-disagg-pd-decider"

    def disaggregate(self, cycle_state: CycleState, request: LLMRequest, decode_endpoint: Endpoint) -> bool:
        return True
