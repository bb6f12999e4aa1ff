"""The flow controller: GIE / llm-d's queue in front of scheduling (llm-d-router
pkg/epp/flowcontrol/controller and registry; semantics re-built, not translated).

* **Bands** by priority, highest first, strictly: a lower band dispatches only while every higher
  band is empty. A band is made on first use from its `priorityBands` entry, else from the
  `defaultNegativePriorityBand` (priority < 0) or `defaultPriorityBand` template.
* **Flows** within a band by fairness id (the `x-gateway-inference-fairness-id` header); the
  band's fairness policy picks the flow, its ordering policy the request within the flow.
* **Capacity**: a request that would take the queue past the global or its band's `maxRequests`
  / `maxBytes` is rejected at once (RejectedCapacity).
* **Dispatch**, one request per dispatch cycle, re-asking the detectors each cycle: the pool's
  saturation is the highest any detector reports; the usage-limit policy gives each band a
  ceiling, and the bands are walked highest first, stopping at the first whose ceiling the
  saturation reaches (llm-d's processor.dispatchCycle). Without a policy every ceiling is 1.0
  (llm-d's default `static-usage-limit-policy`): dispatch while no detector says saturated. A
  request dispatched but not yet scheduled is invisible to a ledger detector (its PreRequest
  comes with the decision), so at most `window` of them may be outstanding: the gate cannot let
  a burst through before the detectors see it. One per endpoint by default; from saturation
  `narrow_at` on, one (the gateway: near saturation a pass of unseen dispatches overfills the
  pods, and a critical request then waits behind their prefills; far from it, the wider window
  keeps a pass-through queue from serialising every request on its scheduling round trip).
* **TTL**: a request queued longer than `defaultRequestTTL` (while the pool has endpoints) or
  `noEndpointRequestTTL` (while it has none; a change of regime starts a fresh budget) is
  evicted: EvictedTTL or EvictedNoEndpoints. 0 disables the bound.
* **Cancel**: a request whose client went away leaves at once (EvictedContextCancelled).

Nothing here waits: `pump()` does whatever the moment allows and returns; the caller calls it
when something changed (an arrival, a completion, new metrics) and at `next_deadline()`."""

from __future__ import annotations

import itertools
import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from scheduler.admission import pool_saturation
from scheduler.config.flow_control import (
    DEFAULT_FAIRNESS_POLICY,
    DEFAULT_ORDERING_POLICY,
    DEFAULT_USAGE_LIMIT_POLICY,
    FEATURE_GATE,
    FlowControlSpec,
    PriorityBandSpec,
    parse_feature_gates,
)
from scheduler.config.models import EndpointPickerConfig
from scheduler.flowcontrol.types import FlowItem, FlowQueue, Outcome
from scheduler.interfaces import FairnessPolicy, OrderingPolicy, Plugin, SaturationDetector, UsageLimitPolicy
from scheduler.types import Endpoint


def flow_control_enabled(cfg: EndpointPickerConfig) -> bool:
    """The `flowControl` feature gate (off unless the config turns it on, as in llm-d)."""
    return parse_feature_gates(cfg.feature_gates).get(FEATURE_GATE, False)


@dataclass(slots=True)
class Band:
    priority: int
    max_requests: int
    max_bytes: int
    ordering: OrderingPolicy
    fairness: FairnessPolicy
    flows: dict[str, FlowQueue] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)  # the fairness policy's, for this band
    size: int = 0
    bytes: int = 0

    def queue(self, fairness_id: str) -> FlowQueue:
        q = self.flows.get(fairness_id)
        if q is None:
            q = self.flows[fairness_id] = FlowQueue(fairness_id, self.ordering.key)
        return q

    def next_item(self) -> FlowItem | None:
        active = [q for q in self.flows.values() if q.size > 0]
        if not active:
            return None
        return self.fairness.pick(active, self.state).pop()


class FlowController:
    """One queue (per gateway replica, or per simulated router). `policy(name)` resolves an
    ordering or fairness policy by plugin name; `usage_limit` gates bands by saturation (None:
    every ceiling 1.0); `clock` is seconds (monotonic or virtual); `window` bounds dispatched
    requests not yet settled (None: one per endpoint), and from pool saturation `narrow_at` on
    only one may be (1.0: never narrowed)."""

    def __init__(
        self,
        spec: FlowControlSpec,
        detectors: Iterable[SaturationDetector],
        policy: Callable[[str], Plugin],
        clock: Callable[[], float] = time.monotonic,
        usage_limit: UsageLimitPolicy | None = None,
        window: int | None = None,
        narrow_at: float = 1.0,
    ) -> None:
        self.spec = spec
        self.window = window
        self.narrow_at = narrow_at
        self.detectors = list(detectors)
        self.usage_limit = usage_limit
        self._policy = policy
        self.clock = clock
        self.bands: dict[int, Band] = {}
        self._order: list[int] = []  # band priorities, highest first
        self._by_age: deque[FlowItem] = deque()  # every queued item, oldest first (TTL sweeps)
        self._seq = itertools.count()
        self._unsettled: set[FlowItem] = set()
        self.size = 0
        self.bytes = 0
        self._ttl = spec.request_ttl()
        self._empty_ttl = spec.no_endpoint_ttl()
        self._empty_pool = False
        self._regime_since = -math.inf
        for band in spec.priority_bands:  # configured bands exist (and their refs resolve) from the start
            self.band(band.priority)
        for template in (spec.default_priority_band, spec.default_negative_priority_band):
            if template is not None:
                self._check_policies(template)

    # ---- bands -------------------------------------------------------------------------------
    def _check_policies(self, spec: PriorityBandSpec) -> tuple[OrderingPolicy, FairnessPolicy]:
        ordering = self._policy(spec.ordering_policy_ref or DEFAULT_ORDERING_POLICY)
        fairness = self._policy(spec.fairness_policy_ref or DEFAULT_FAIRNESS_POLICY)
        if not isinstance(ordering, OrderingPolicy):
            raise TypeError(f"band {spec.priority}: plugin {ordering.name!r} is not an ordering policy")
        if not isinstance(fairness, FairnessPolicy):
            raise TypeError(f"band {spec.priority}: plugin {fairness.name!r} is not a fairness policy")
        return ordering, fairness

    def band(self, priority: int) -> Band:
        band = self.bands.get(priority)
        if band is None:
            spec = self.spec.band_spec(priority)
            ordering, fairness = self._check_policies(spec)
            band = Band(priority, spec.band_max_requests(), spec.band_max_bytes(), ordering, fairness)
            self.bands[priority] = band
            self._order = sorted(self.bands, reverse=True)
        return band

    # ---- the request's side ------------------------------------------------------------------
    def enqueue(self, item: FlowItem) -> Outcome | None:
        """Queue the request, or answer RejectedCapacity at once (its callback is not called).
        Call `pump()` afterwards: the request may be dispatchable right away."""
        now = self.clock()
        item.enqueue_time = now
        item.seq = next(self._seq)
        item.ttl = self._empty_ttl if self._empty_pool else self._ttl
        band = self.band(item.priority)
        s = self.spec
        if (
            (s.max_requests and self.size + 1 > s.max_requests)
            or (s.max_bytes and self.bytes + item.byte_size > s.max_bytes)
            or band.size + 1 > band.max_requests
            or band.bytes + item.byte_size > band.max_bytes
        ):
            item.outcome, item.finish_time = Outcome.REJECTED_CAPACITY, now
            return item.outcome
        band.queue(item.fairness_id).push(item)
        band.size += 1
        band.bytes += item.byte_size
        self.size += 1
        self.bytes += item.byte_size
        self._by_age.append(item)
        return None

    def cancel(self, item: FlowItem) -> bool:
        """The client went away: the request leaves the queue now. False if it already left."""
        if not item.queued:
            self._unsettled.discard(item)
            return False
        self._leave(item, Outcome.EVICTED_CANCELLED, self.clock())
        return True

    def settled(self, item: FlowItem) -> None:
        """A dispatched request was scheduled (or failed): the detectors now see it."""
        self._unsettled.discard(item)

    # ---- the dispatcher's side ---------------------------------------------------------------
    def pump(self, endpoints: list[Endpoint]) -> int:
        """Evict what has outlived its TTL, then dispatch while the pool is not saturated.
        Returns how many requests were dispatched."""
        now = self.clock()
        self._expire(endpoints, now)
        wide = self.window or max(1, len(endpoints))
        dispatched = 0
        while self.size and len(self._unsettled) < wide:
            saturation = pool_saturation(self.detectors, endpoints)
            if saturation >= self.narrow_at and self._unsettled:
                break  # near saturation: one unseen dispatch at a time
            item = self._next_item(saturation)
            if item is None:
                break
            self._unsettled.add(item)
            dispatched += 1
            self._leave(item, Outcome.DISPATCHED, now, popped=True)
        return dispatched

    def next_deadline(self) -> float:
        """When the oldest queued request's budget runs out (inf: nothing queued or no TTL)."""
        self._trim_age()
        if not self._by_age:
            return math.inf
        return self._expiry(self._by_age[0])

    @property
    def unsettled(self) -> int:
        return len(self._unsettled)

    def queued_by_flow(self) -> dict[tuple[int, str], tuple[int, int]]:
        """(priority, fairness id) -> (requests, bytes) queued now."""
        return {
            (b.priority, fid): (q.size, q.bytes) for b in self.bands.values() for fid, q in b.flows.items() if q.size
        }

    # ---- internals ---------------------------------------------------------------------------
    def _next_item(self, saturation: float) -> FlowItem | None:
        """One dispatch cycle: the best request of the highest band with one, unless a band on the
        way (empty or not) is held by its ceiling; None then."""
        order = self._order
        ceilings = [1.0] * len(order) if self.usage_limit is None else self.usage_limit.ceilings(saturation, order)
        for priority, ceiling in zip(order, ceilings, strict=True):
            if saturation >= ceiling:
                return None
            band = self.bands[priority]
            if band.size:
                item = band.next_item()
                if item is not None:
                    return item
        raise AssertionError("flow control counts a request that no band holds")

    def _expiry(self, item: FlowItem) -> float:
        budget = self._empty_ttl if self._empty_pool else self._ttl
        if budget <= 0:
            return math.inf
        start = max(item.enqueue_time, self._regime_since)
        end = start + budget
        if self._ttl > 0 and self._empty_ttl > 0:  # a regime change never extends the longer budget
            end = min(end, item.enqueue_time + max(self._ttl, self._empty_ttl))
        return end

    def _expire(self, endpoints: list[Endpoint], now: float) -> None:
        empty = not endpoints
        if empty != self._empty_pool:
            self._empty_pool, self._regime_since = empty, now
        outcome = Outcome.EVICTED_NO_ENDPOINTS if empty else Outcome.EVICTED_TTL
        while True:
            self._trim_age()
            if not self._by_age or self._expiry(self._by_age[0]) > now:
                return
            self._leave(self._by_age[0], outcome, now)

    def _trim_age(self) -> None:
        while self._by_age and not self._by_age[0].queued:
            self._by_age.popleft()

    def _leave(self, item: FlowItem, outcome: Outcome, now: float, popped: bool = False) -> None:
        band = self.bands[item.priority]
        queue = band.flows[item.fairness_id]
        if not popped:
            queue.forget(item)
        if queue.size == 0:  # an idle flow is forgotten (llm-d collects them), so ids a client picks do not pile up
            del band.flows[item.fairness_id]
        band.size -= 1
        band.bytes -= item.byte_size
        self.size -= 1
        self.bytes -= item.byte_size
        item.outcome, item.finish_time = outcome, now
        if item.on_outcome is not None:
            item.on_outcome(item)


def build_flow_controller(
    cfg: EndpointPickerConfig,
    plugins: dict[str, Plugin],
    detectors: Iterable[SaturationDetector],
    clock: Callable[[], float] = time.monotonic,
    window: int | None = None,
    narrow_at: float = 1.0,
) -> FlowController | None:
    """The config's flow controller when the `flowControl` gate is on, else None (shed-only
    admission, as before). `plugins` are the built instances (the policies among them)."""
    if not flow_control_enabled(cfg):
        return None

    def policy(name: str) -> Plugin:
        plugin = plugins.get(name)
        if plugin is None:
            raise KeyError(f"flowControl names plugin {name!r}, which is not in 'plugins'")
        return plugin

    spec = cfg.flow_control or FlowControlSpec()
    usage_limit = policy(spec.usage_limit_policy_plugin_ref) if spec.usage_limit_policy_plugin_ref else None
    if usage_limit is None:  # llm-d's default, which the loader adds (absent: the same ceilings of 1.0)
        usage_limit = plugins.get(DEFAULT_USAGE_LIMIT_POLICY)
    if usage_limit is not None and not isinstance(usage_limit, UsageLimitPolicy):
        raise TypeError(f"flowControl.usageLimitPolicyPluginRef: {usage_limit.name!r} is not a usage-limit policy")
    return FlowController(spec, detectors, policy, clock, usage_limit, window, narrow_at)
