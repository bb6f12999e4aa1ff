"""`slo-deadline-ordering-policy` (llm-d-router's flow-control ordering): within a flow, the
request whose TTFT SLO runs out first dispatches first. Deadline = enqueue time +
`x-slo-ttft-ms`; a request without one has no deadline and goes after every one that has, in
enqueue order (so a flow without SLO headers is served FCFS). A malformed header counts as none
here; the gateway has answered it 400 before it could be queued."""

from __future__ import annotations

import math
from typing import Any

from scheduler.errors import SchedulingError
from scheduler.flowcontrol.types import FlowItem
from scheduler.interfaces import OrderingPolicy
from scheduler.plugins.support.slo import slo_targets
from scheduler.registry import register
from scheduler.types import LLMRequest


@register
class SLODeadlineOrderingPolicy(OrderingPolicy):
    type_name = "slo-deadline-ordering-policy"

    def key(self, item: FlowItem) -> tuple:
        request = queued_request(item.payload)
        deadline = math.inf
        if request is not None:
            try:
                ttft_ms = slo_targets(request).ttft_ms
            except SchedulingError:
                ttft_ms = None
            if ttft_ms is not None:
                deadline = item.enqueue_time + ttft_ms / 1000.0
        return (deadline, item.enqueue_time)


def queued_request(payload: Any) -> LLMRequest | None:
    """The LLMRequest a queue item carries: the gateway queues the request itself, the cluster
    simulation a (SimRequest, LLMRequest) pair."""
    if isinstance(payload, LLMRequest):
        return payload
    if isinstance(payload, tuple):
        return next((p for p in payload if isinstance(p, LLMRequest)), None)
    return None
