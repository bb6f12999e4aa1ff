"""The gateway replica's side of flow control: requests wait here, in this replica's
`FlowController` (scheduler/flowcontrol/controller.py), until the pool has room.

* Where the queue lives: in each replica (docs/DESIGN.md, "Flow control"). The saturation signal is
  what the replica already has: the datastore's snapshot that every replica shares (scraped
  queues, KV cache) and the replica's own ledger detectors.
* When it dispatches: at once if the pool has room (an enqueue runs a dispatch pass), when this
  replica sees a first token or a completion or settles a dispatch, and on a `TICK_S` timer while
  anything waits (new scraped metrics, TTL expiry).
* A client that goes away while queued (its `http.disconnect`) leaves the queue at once.
* Outcomes, as llm-d answers them (pkg/epp/requestcontrol/admission.go): queue full 429,
  TTL expired 429 (503 when the pool has no endpoints), each with llm-d's
  `x-llm-d-request-dropped-reason` header; OpenAI-shaped like every gateway error.
* Metrics with GIE's names: queue size and bytes now, and time queued by outcome, per priority
  and fairness id (the first `MAX_FLOW_LABELS` ids a replica sees; later ones are `other`); the
  time to enqueue and each dispatch pass; llm-d's count of requests by outcome; and the fairness
  policies' own gauges (program-aware-fairness's, with llm-d's names), which /metrics reads from
  the answering replica's policies at render time (serve_app/gateway/metrics_page.py, with saturation and
  each band's fill)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from scheduler import ErrorCode, LLMRequest
from scheduler.flowcontrol.controller import FlowController
from scheduler.flowcontrol.types import DEFAULT_FAIRNESS_ID, FAIRNESS_ID_HEADER, FlowItem, Outcome
from scheduler.interfaces import ReportsGauges
from scheduler.types import Endpoint
from serve_app.gateway.errors import GatewayError

TICK_S = 0.01
MAX_FLOW_LABELS = 32
POOL = "default"
DROPPED_REASON_HEADER = "x-llm-d-request-dropped-reason"
RETRY_AFTER_S = "1"
QUEUE_SIZE = "inference_extension_flow_control_queue_size"
QUEUE_BYTES = "inference_extension_flow_control_queue_bytes"
QUEUE_DURATION = "inference_extension_flow_control_request_queue_duration_seconds"
ENQUEUE_DURATION = "inference_extension_flow_control_request_enqueue_duration_seconds"
DISPATCH_CYCLE = "inference_extension_flow_control_dispatch_cycle_duration_seconds"
OUTCOMES = "llm_d_epp_flow_control_requests_total"
NOT_FINALIZED = "NotYetFinalized"  # llm-d's enqueue outcome for a request that waits in the queue


class FlowGate:
    def __init__(
        self,
        controller: FlowController,
        endpoints: Callable[[], list[Endpoint]],
        recorder: Any,
        model_label: Callable[[LLMRequest], str],
        priority_label: Callable[[int], str],
    ) -> None:
        self.controller = controller
        self._endpoints = endpoints
        self._recorder = recorder
        self._model_label = model_label
        self._priority_label = priority_label
        self._flow_labels: set[str] = set()
        self._dispatched: dict[int, FlowItem] = {}  # id(request) -> its item, until settled
        self._task: asyncio.Task | None = None

    async def admit(self, request: LLMRequest, http: Any, size: int) -> FlowItem:
        """Return once the request is dispatched (its item: when, how long it waited); raise
        GatewayError if it is not."""
        fairness_id = request.headers.get(FAIRNESS_ID_HEADER) or DEFAULT_FAIRNESS_ID
        waiter: asyncio.Future = asyncio.get_running_loop().create_future()
        item = FlowItem(
            request.request_id, request.priority, fairness_id, size, payload=request,
            on_outcome=lambda it: self._left(it, waiter),
        )  # fmt: skip
        enqueued = time.perf_counter()
        refused = self.controller.enqueue(item)
        fid, prio, _, _ = self._labels(item)
        outcome = NOT_FINALIZED if refused is None else refused.value
        self._recorder.observe(ENQUEUE_DURATION, time.perf_counter() - enqueued, (fid, prio, outcome))
        if refused is not None:
            self._observe(item)
            raise _refusal(item, self.controller)
        self._gauges(item, 1.0)
        self.pump()
        if not waiter.done():
            self._ensure_ticking()
            await self._wait(item, waiter, http)
        if item.outcome is not Outcome.DISPATCHED:
            raise _refusal(item, self.controller)
        self._dispatched[id(request)] = item
        return item

    def settle(self, request: LLMRequest) -> None:
        """The request was scheduled and its PreRequest told (or it failed): the detectors see it."""
        item = self._dispatched.pop(id(request), None)
        if item is not None:
            self.controller.settled(item)
            self.pump()

    def policy_gauges(self) -> dict[tuple[str, tuple[str, ...]], float]:
        """This replica's fairness policies' own gauges (program-aware-fairness: llm-d's names), for
        /metrics beside the queue's; each policy instance once, however many bands share it."""
        out: dict[tuple[str, tuple[str, ...]], float] = {}
        seen: set[int] = set()
        for band in list(self.controller.bands.values()):
            policy = band.fairness
            if isinstance(policy, ReportsGauges) and id(policy) not in seen:
                seen.add(id(policy))
                out.update(policy.gauges())
        return out

    def pump(self) -> None:
        if self.controller.size:
            started = time.perf_counter()
            self.controller.pump(self._endpoints())
            self._recorder.observe(DISPATCH_CYCLE, time.perf_counter() - started)

    # ---- internals ---------------------------------------------------------------------------
    async def _wait(self, item: FlowItem, waiter: asyncio.Future, http: Any) -> None:
        """Until the request leaves the queue, or its client disconnects (then it leaves now)."""
        gone = asyncio.ensure_future(_disconnected(http)) if http is not None else None
        try:
            await asyncio.wait([waiter] if gone is None else [waiter, gone], return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the replica cancelled the request: it must not be dispatched later
            self.controller.cancel(item)
            raise
        finally:
            if gone is not None and not gone.done():
                gone.cancel()
        if not waiter.done():
            self.controller.cancel(item)

    def _left(self, item: FlowItem, waiter: asyncio.Future) -> None:
        self._gauges(item, -1.0)
        self._observe(item)
        if not waiter.done():
            waiter.set_result(item.outcome)

    def _ensure_ticking(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._tick())

    async def _tick(self) -> None:
        """While anything waits: dispatch on new metrics, expire on TTL (at most TICK_S late)."""
        fc = self.controller
        while fc.size:
            await asyncio.sleep(max(0.0, min(TICK_S, fc.next_deadline() - fc.clock())))
            self.pump()

    def _labels(self, item: FlowItem) -> tuple[str, str, str, str]:
        fid = item.fairness_id
        if fid not in self._flow_labels:
            if len(self._flow_labels) >= MAX_FLOW_LABELS:
                fid = "other"
            else:
                self._flow_labels.add(fid)
        model = self._model_label(item.payload)
        return fid, self._priority_label(item.priority), model, model

    def _gauges(self, item: FlowItem, sign: float) -> None:
        fid, prio, model, target = self._labels(item)
        labels = (fid, prio, POOL, model, target)
        self._recorder.add_gauge(QUEUE_SIZE, labels, sign)
        self._recorder.add_gauge(QUEUE_BYTES, labels, sign * item.byte_size)

    def _observe(self, item: FlowItem) -> None:
        fid, prio, model, target = self._labels(item)
        assert item.outcome is not None
        self._recorder.observe(QUEUE_DURATION, item.queued_s, (fid, prio, item.outcome.value, POOL, model, target))
        self._recorder.inc(OUTCOMES, (item.outcome.value, prio, POOL))


async def _disconnected(http: Any) -> None:
    """Returns when the ASGI server reports the client gone (the body was read before)."""
    while True:
        message = await http.receive()
        if message["type"] == "http.disconnect":
            return


def _refusal(item: FlowItem, fc: FlowController) -> GatewayError:
    """A request that left the queue without being dispatched, as llm-d answers it."""
    o = item.outcome
    if o is Outcome.REJECTED_CAPACITY:
        s = fc.spec
        limits = ", ".join(
            f"{name} {value}" for name, value in (("maxRequests", s.max_requests), ("maxBytes", s.max_bytes)) if value
        )
        return GatewayError(
            429,
            f"flow control queue full for priority {item.priority} ({limits or 'band limits'}); request rejected",
            code=ErrorCode.RESOURCE_EXHAUSTED.value,
            headers={DROPPED_REASON_HEADER: "rejected-saturated", "Retry-After": RETRY_AFTER_S},
        )
    if o is Outcome.EVICTED_NO_ENDPOINTS:
        return GatewayError(
            503,
            f"request timed out in queue after {item.queued_s:.3g} s and no endpoints are available",
            code=ErrorCode.SERVICE_UNAVAILABLE.value,
            headers={DROPPED_REASON_HEADER: "rejected-no-endpoints", "Retry-After": RETRY_AFTER_S},
        )
    if o is Outcome.EVICTED_TTL:
        return GatewayError(
            429,
            f"request timed out in queue after {item.queued_s:.3g} s (flowControl defaultRequestTTL "
            f"{fc.spec.request_ttl():g} s): the pool stayed saturated",
            code=ErrorCode.RESOURCE_EXHAUSTED.value,
            headers={DROPPED_REASON_HEADER: "rejected-ttl-expired", "Retry-After": RETRY_AFTER_S},
        )
    # EvictedContextCancelled: nobody is listening; the status is for the logs and metrics.
    return GatewayError(
        503,
        "client disconnected while queued",
        code=ErrorCode.SERVICE_UNAVAILABLE.value,
        headers={DROPPED_REASON_HEADER: "rejected-context-cancelled"},
    )
