"""`critical-request-filter`: all endpoints for a critical request, none otherwise.

criticalRequestPredicate, the root of GIE's original filter tree (pkg/epp/scheduling/scheduler.go
and filter.go at a70d66e5): in a `decision-tree-filter` a critical request continues on
`nextOnSuccess`, any other on `nextOnFailure` with every endpoint.

Which requests are critical: that tree had a boolean (InferenceModel criticality == Critical).
Requests here carry an integer priority (Critical 1, Standard 0, Sheddable -1) and, as in GIE
today and DESIGN.md, only priority < 0 is sheddable. So by default a request is critical when
priority >= 0 (`minPriority: 0`); set `minPriority: 1` to treat only Critical requests as critical,
which is that tree's reading (Standard requests then take the sheddable branch)."""

from __future__ import annotations

from pydantic import Field

from scheduler.cycle_state import CycleState
from scheduler.interfaces import Filter, Parameters
from scheduler.registry import register
from scheduler.types import Endpoint, LLMRequest


class CriticalRequestParameters(Parameters):
    min_priority: int = Field(default=0, alias="minPriority")


@register
class CriticalRequestFilter(Filter):
    type_name = "critical-request-filter"
    Parameters = CriticalRequestParameters

    def filter(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        return list(endpoints) if request.priority >= self.params.min_priority else []
