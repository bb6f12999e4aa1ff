"""Our scheduler, any EndpointPickerConfig, as a cluster-simulation router.

* Reproducible: the plugins' random tie-breaks (`max-score-picker`, `random-picker`, the LoRA
  filter) draw from generators seeded with `seed` and the plugin's name (the plugins' handle,
  `PluginHandle.rng`), so a run with a given seed gives the same decisions every time.
* Pods -> endpoints: each PodView becomes an `Endpoint` whose `Metrics` are the pod's last scraped
  metrics, with `update_time` set from the scrape time. The plugins are built with the simulation's
  virtual clock as their handle's clocks (e.g. the utilization detector's staleness check), so a
  metric is exactly as stale as the simulation made it.
* Requests -> `LLMRequest`: id, model, OpenAI body, headers and priority (< 0 is sheddable).
* Admission, as the gateway does it (serve_app.gateway.core.GatewayCore.admit) before scheduling: a
  sheddable request is shed while the pool is saturated — any of the config's saturation detectors,
  plus GIE's utilization detector (queue 5, KV 0.8) if it declares none (scheduler.admission).
  A ResourceExhausted from the scheduler (e.g. the legacy filter tree dropping a sheddable request)
  is a shed too; any other SchedulingError is an error. Both answer None (the simulation's drop)
  and are told apart in `shed` / `errors`.
* `Scheduler.schedule` runs the PreRequest hooks, so the prefix index learns each decision;
  `on_first_token` calls `response_first_token` (the gateway sees the first streamed chunk) and
  `on_complete` calls `response_complete` for plugins that count work in flight.
* Flow control, as the gateway runs it, when the config turns the `flowControl` gate on: every
  request is enqueued (its fairness id from `x-gateway-inference-fairness-id`, its size the JSON
  body's) and the router answers HOLD; the simulation polls after every event and the queue
  dispatches, in virtual time, while the detectors say the pool is not saturated. A dispatched
  request is scheduled at once (so a ledger detector sees it before the next dispatch); one
  rejected for capacity or evicted on TTL is a shed (`flow_outcomes` says which).
* P/D configs: when the result has a prefill target (the handler's prefill profile, else GIE's
  "prefill"), the answer is (prefill pod, decode pod).
* KV events: when the config has a KVEventSink (`precise-prefix-cache-producer`), the router has
  `on_kv_events`, so the simulation turns its pods' events on and delivers each step's batch in
  virtual time (a pod is `live` from its first batch); each request carries the token ids a
  simulated pod without a tokenizer sees (`ray_epp.simulator.tokens.token_ids`), unless the config has a
  `token-producer`, which then tokenizes as in the gateway (pods with a `tokenizer` need one).
* Predictions: for every completed request, the prefix match the scheduler attached to its target
  (PREFIX_MATCH_KEY) against the tokens the pod really served from its cache (`predictions`:
  right within one block / total)."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

from ray_epp.simulator import HOLD, PodView, RequestResult, RouteDecision, SimRequest
from ray_epp.simulator.tokens import token_ids
from scheduler import Endpoint, EndpointPickerConfig, LLMRequest, Metrics, Scheduler, SchedulingError, load_config_file
from scheduler.admission import admission_detectors, pool_saturated
from scheduler.errors import ErrorCode
from scheduler.flowcontrol.controller import build_flow_controller
from scheduler.flowcontrol.types import DEFAULT_FAIRNESS_ID, FAIRNESS_ID_HEADER, FlowItem, Outcome
from scheduler.interfaces import KVEventSink, PluginHandle
from scheduler.plugins.support.prefix import PREFIX_MATCH_KEY
from scheduler.plugins.support.prefix.precise_index import LIVE
from scheduler.plugins.support.tokenized import TOKEN_PRODUCER, set_request_tokens
from scheduler.types import SchedulingResult

# Virtual time + this is what the scheduler's clocks read: update_time 0 means "not tracked".
VIRTUAL_EPOCH = 1_000_000.0
PREFILL_PROFILE = "prefill"


class SchedulerRouter:
    def __init__(self, config: str | Path | EndpointPickerConfig, *, admission: bool = True, seed: int = 0) -> None:
        cfg = config if isinstance(config, EndpointPickerConfig) else load_config_file(config)
        self.now = 0.0
        handle = PluginHandle(clock=self.virtual_clock, wall_clock=self.virtual_clock, seed=seed)
        self.scheduler = Scheduler.from_config(cfg, handle=handle)
        self.admission = admission
        self.scheduler.cycle_seeds = random.Random(f"{seed}:cycles")
        self.detectors = admission_detectors(
            self.scheduler.plugins.values(), named=self.scheduler.saturation_detector, handle=handle
        )
        self.flow = None
        if admission:
            self.flow = build_flow_controller(cfg, self.scheduler.plugins, self.detectors, clock=lambda: self.now)
        self.flow_outcomes: dict[str, Outcome] = {}
        self._released: list[tuple[SimRequest, RouteDecision]] = []
        self._pumping_on: list[Endpoint] = []
        self.shed: set[str] = set()
        self.errors: dict[str, str] = {}
        self._endpoints: dict[str, tuple[dict, float, Endpoint]] = {}
        self._requests: dict[str, LLMRequest] = {}
        self.kv_sinks = self.scheduler.hooks.having(KVEventSink)
        if self.kv_sinks:
            self.on_kv_events = self._on_kv_events  # the simulation delivers events only when this exists
        producers = {getattr(p, "type_name", "") for p in self.scheduler.plugins.values()}
        self.sim_tokens = bool(self.kv_sinks) and TOKEN_PRODUCER not in producers
        self._live: set[str] = set()
        self._predicted: dict[str, tuple[int, int]] = {}  # request id -> (predicted tokens, block size)
        # right / total over completed requests; *_cached: only those predicted or served with a cache hit
        self.predictions = {"right": 0, "total": 0, "right_cached": 0, "total_cached": 0}

    def _on_kv_events(self, pod: str, batch: object) -> None:
        if pod not in self._live:
            self.scheduler.hooks.kv_event_status(pod, LIVE)
        self.scheduler.hooks.kv_events(pod, [batch])
        self._live.add(pod)

    def virtual_clock(self) -> float:
        return VIRTUAL_EPOCH + self.now

    def endpoint(self, pod: PodView) -> Endpoint:
        """The pod as an Endpoint, rebuilt only when a scrape gave it new metrics."""
        cached = self._endpoints.get(pod.name)
        if cached is not None and cached[0] is pod.metrics and cached[1] == pod.scraped_at:
            return cached[2]
        metrics = Metrics.from_json(pod.metrics)
        metrics.update_time = VIRTUAL_EPOCH + pod.scraped_at
        ep = Endpoint(name=pod.name, labels=dict(pod.labels), metrics=metrics)
        self._endpoints[pod.name] = (pod.metrics, pod.scraped_at, ep)
        return ep

    def route(self, request: SimRequest, pods: list[PodView], now: float) -> str | tuple[str, str] | None:
        self.now = now
        endpoints = [self.endpoint(p) for p in pods]
        req = LLMRequest(
            request_id=request.request_id,
            target_model=request.model,
            body=request.body,
            headers=dict(request.headers),
            priority=request.priority,
        )
        if self.sim_tokens and isinstance(request.prompt, (str, list)):
            set_request_tokens(req, token_ids(request.prompt))
        if self.flow is not None:
            return self._enqueue(request, req, endpoints)
        if self.admission and req.sheddable and pool_saturated(self.detectors, endpoints):
            self.shed.add(request.request_id)
            return None
        return self._schedule(request, req, endpoints)

    def _schedule(self, request: SimRequest, req: LLMRequest, endpoints: list[Endpoint]) -> RouteDecision:
        try:
            result = self.scheduler.schedule(req, endpoints)
        except SchedulingError as err:
            if err.code == ErrorCode.RESOURCE_EXHAUSTED:
                self.shed.add(request.request_id)
            else:
                self.errors[request.request_id] = f"{err.code.value}: {err.message}"
            return None
        self._requests[request.request_id] = req
        info = result.target.attributes.get(PREFIX_MATCH_KEY)
        if info is not None:
            self._predicted[request.request_id] = (info.match_tokens, info.block_size_tokens)
        decode = result.target.name
        prefill = prefill_target(result)
        return (prefill, decode) if prefill is not None and prefill != decode else decode

    # ---- flow control ----------------------------------------------------------------------------
    def _enqueue(self, request: SimRequest, req: LLMRequest, endpoints: list[Endpoint]) -> RouteDecision:
        assert self.flow is not None
        fairness_id = next((v for k, v in request.headers.items() if k.lower() == FAIRNESS_ID_HEADER), "")
        item = FlowItem(
            request.request_id,
            req.priority,
            fairness_id or DEFAULT_FAIRNESS_ID,
            len(json.dumps(request.body)),
            payload=(request, req),
            on_outcome=self._left_queue,
        )
        if self.flow.enqueue(item) is not None:
            self.flow_outcomes[request.request_id] = Outcome.REJECTED_CAPACITY
            self.shed.add(request.request_id)
            return None
        self._pump(endpoints)
        return HOLD

    def _pump(self, endpoints: list[Endpoint]) -> None:
        assert self.flow is not None
        self._pumping_on = endpoints
        self.flow.pump(endpoints)

    def _left_queue(self, item: FlowItem) -> None:
        """A request leaves the queue: dispatched ones are scheduled now, before the next dispatch."""
        assert self.flow is not None and item.outcome is not None
        request, req = item.payload
        self.flow_outcomes[request.request_id] = item.outcome
        decision: RouteDecision = None
        if item.outcome is Outcome.DISPATCHED:
            decision = self._schedule(request, req, self._pumping_on)
            self.flow.settled(item)
        else:
            self.shed.add(request.request_id)
        self._released.append((request, decision))

    def poll(self, pods: list[PodView], now: float) -> list[tuple[SimRequest, RouteDecision]]:
        if self.flow is not None:
            self.now = now
            self._pump([self.endpoint(p) for p in pods])
        released, self._released = self._released, []
        return released

    def next_poll(self) -> float:
        return self.flow.next_deadline() if self.flow is not None else math.inf

    def on_first_token(self, request: SimRequest, pod: str, now: float) -> None:
        req = self._requests.get(request.request_id)
        if req is not None:
            self.now = now
            self.scheduler.response_first_token(req, pod)

    def on_complete(self, request: SimRequest, pod: str | None, result: RequestResult) -> None:
        req = self._requests.pop(request.request_id, None)
        if req is not None and pod is not None:
            self.scheduler.response_complete(req, pod)
        predicted = self._predicted.pop(request.request_id, None)
        if predicted is not None and result.status == "ok":
            right = abs(predicted[0] - result.cached_tokens) <= predicted[1]
            self.predictions["total"] += 1
            self.predictions["right"] += right
            if predicted[0] or result.cached_tokens:
                self.predictions["total_cached"] += 1
                self.predictions["right_cached"] += right


def prefill_target(result: SchedulingResult) -> str | None:
    """The prefill profile's endpoint when the result has one apart from the primary profile."""
    name = result.prefill_profile_name or PREFILL_PROFILE
    if name == result.primary_profile_name:
        return None
    prefill = result.profile_results.get(name)
    return prefill.target_endpoints[0].name if prefill is not None and prefill.target_endpoints else None
