"""`fcfs-ordering-policy`: first come, first served within a flow (llm-d-router
pkg/epp/framework/plugins/flowcontrol/ordering/fcfs). The key is the logical enqueue time; the
queue is a heap, so the order is strict (llm-d's "strict FCFS" pairing)."""

from __future__ import annotations

from scheduler.flowcontrol.types import FlowItem
from scheduler.interfaces import OrderingPolicy
from scheduler.registry import register


@register
class FCFSOrderingPolicy(OrderingPolicy):
    type_name = "fcfs-ordering-policy"

    def key(self, item: FlowItem) -> tuple:
        return (item.enqueue_time,)
