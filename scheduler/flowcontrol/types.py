"""What flow control holds: a request waiting (FlowItem), one flow's queue (FlowQueue), and how a
request leaves (Outcome, llm-d-router pkg/epp/flowcontrol/types/outcomes.go)."""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

FAIRNESS_ID_HEADER = "x-gateway-inference-fairness-id"  # GIE's flow key header
DEFAULT_FAIRNESS_ID = "default-flow"  # one flow when the header is absent


class Outcome(StrEnum):
    """GIE's queue outcomes (their metric label values)."""

    DISPATCHED = "Dispatched"
    REJECTED_CAPACITY = "RejectedCapacity"
    EVICTED_TTL = "EvictedTTL"
    EVICTED_NO_ENDPOINTS = "EvictedNoEndpoints"
    EVICTED_CANCELLED = "EvictedContextCancelled"


@dataclass(slots=True, eq=False)
class FlowItem:
    """One request in flow control. `payload` is the caller's (the request); `on_outcome` is called
    once, when the request leaves the queue (dispatched or evicted; not when rejected at enqueue,
    which `enqueue` answers itself)."""

    request_id: str
    priority: int = 0
    fairness_id: str = DEFAULT_FAIRNESS_ID
    byte_size: int = 0
    payload: Any = None
    on_outcome: Callable[[FlowItem], None] | None = None
    enqueue_time: float = math.nan
    ttl: float = 0.0  # the queue-wait budget when enqueued (0: none); EDF's deadline
    seq: int = 0
    outcome: Outcome | None = None
    finish_time: float = math.nan

    @property
    def deadline(self) -> float:
        return self.enqueue_time + self.ttl if self.ttl > 0 else math.inf

    @property
    def queued_s(self) -> float:
        return self.finish_time - self.enqueue_time

    @property
    def queued(self) -> bool:
        return self.outcome is None and not math.isnan(self.enqueue_time)


class FlowQueue:
    """The queue of one flow within one band, ordered by its band's ordering policy (`key`:
    smaller goes first). A removed item is left in the heap and skipped (lazy deletion)."""

    __slots__ = ("_heap", "_key", "bytes", "fairness_id", "size")

    def __init__(self, fairness_id: str, key: Callable[[FlowItem], tuple]) -> None:
        self.fairness_id = fairness_id
        self._key = key
        self._heap: list[tuple[tuple, int, FlowItem]] = []
        self.size = 0
        self.bytes = 0

    def push(self, item: FlowItem) -> None:
        heapq.heappush(self._heap, (self._key(item), item.seq, item))
        self.size += 1
        self.bytes += item.byte_size

    def _trim(self) -> None:
        while self._heap and not self._heap[0][2].queued:
            heapq.heappop(self._heap)

    def head(self) -> FlowItem | None:
        self._trim()
        return self._heap[0][2] if self._heap else None

    def head_key(self) -> tuple | None:
        self._trim()
        return (self._heap[0][0], self._heap[0][1]) if self._heap else None

    def pop(self) -> FlowItem:
        self._trim()
        item = heapq.heappop(self._heap)[2]
        self.forget(item)
        return item

    def forget(self, item: FlowItem) -> None:
        """Count an item out that leaves other than by `pop` (its heap entry is skipped later)."""
        self.size -= 1
        self.bytes -= item.byte_size
