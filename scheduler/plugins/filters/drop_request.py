"""`drop-request-filter`: remove every endpoint and fail the request with ResourceExhausted (429).

The "drop request" leaf of GIE's original filter tree (pkg/epp/scheduling/scheduler.go and filter.go
at a70d66e5): sheddable requests are dropped when no endpoint has capacity, to keep room for
critical ones. The error goes to cycle_state under FILTER_FAILURE_KEY, which the profile raises
instead of its generic "no endpoints" error."""

from __future__ import annotations

from scheduler.cycle_state import FILTER_FAILURE_KEY, CycleState
from scheduler.errors import ErrorCode, SchedulingError
from scheduler.interfaces import Filter
from scheduler.registry import register
from scheduler.types import Endpoint, LLMRequest

DROP_MESSAGE = "dropping request due to limited backend resources"


@register
class DropRequestFilter(Filter):
    type_name = "drop-request-filter"

    def filter(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        cycle_state.write(FILTER_FAILURE_KEY, SchedulingError(ErrorCode.RESOURCE_EXHAUSTED, DROP_MESSAGE))
        return []
