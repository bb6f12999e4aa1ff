"""`edf-ordering-policy`: earliest deadline first within a flow (llm-d-router
pkg/epp/framework/plugins/flowcontrol/ordering/edf). Deadline = enqueue time + the request's
TTL; a request without a TTL has no deadline and goes after every one that has; ties by enqueue
time. (Every request gets the controller's TTL today, in llm-d too, so EDF orders like FCFS
until per-request TTLs exist.)"""

from __future__ import annotations

from scheduler.flowcontrol.types import FlowItem
from scheduler.interfaces import OrderingPolicy
from scheduler.registry import register


@register
class EDFOrderingPolicy(OrderingPolicy):
    type_name = "edf-ordering-policy"

    def key(self, item: FlowItem) -> tuple:
        return (item.deadline, item.enqueue_time)
