"""The request path both front doors share (`GatewayCore`): admit, schedule through the profile
actors, forward to the chosen model server, and tell the plugins what happened.

The HTTP door (`serve_app/gateway/deployment.py`) and the ext_proc door (`serve_app/extproc/`)
call it; any number of replicas share the same actors, hence the same scheduling state."""

import json
import os
import time
from typing import Any

from fastapi import Request
from starlette.responses import Response, StreamingResponse

from actors.metrics_hub import MetricsPusher, MetricsRecorder
from scheduler import (
    CycleState,
    ErrorCode,
    LLMRequest,
    Responder,
    SchedulingError,
    SchedulingResult,
    load_config,
    schedule_cycles,
)
from scheduler.admission import admission_detectors, pool_saturated
from scheduler.config import Placement, build_for
from scheduler.flowcontrol.controller import build_flow_controller
from scheduler.interfaces import bind_plugin_metrics
from scheduler.lifecycle import Lifecycle, LifecycleEvent
from scheduler.loop import DataPreparation
from scheduler.trace import SchedulingTrace
from serve_app.admin.api import AdminApi
from serve_app.gateway.decision_record import DecisionRecorder
from serve_app.gateway.disagg import PD_PATHS, hand_off
from serve_app.gateway.endpoint_view import EndpointView
from serve_app.gateway.errors import GatewayError
from serve_app.gateway.exchange import Exchange
from serve_app.gateway.flow_gate import FlowGate
from serve_app.gateway.forwarder import Forwarder, UpstreamUnavailable, relay, response_headers
from serve_app.gateway.intake import RequestIntake
from serve_app.gateway.local_runner import LocalProfileRunner
from serve_app.gateway.parsing import REQUEST_ID_HEADER, ParsedRequest, parse_request
from serve_app.gateway.ray_runner import RayProfileRunner
from serve_app.gateway.request_metrics import GatewayMetrics
from serve_app.gateway.route_hooks import RouteHooks
from serve_app.gateway.settings import GatewaySettings
from serve_app.gateway.side_routes import DESTINATION_HEADER
from serve_app.gateway.tracing import NO_SPANS, current_spans, request_tracing

# A new replica's first requests wait at most this for the pool. Not shorter: a replica Serve starts
# in place of one lost with its node may come up while the datastore (lost too) is being rebuilt,
# and a rebuilt datastore publishes nothing until its pods have reported again (a 5 s wait let
# 4 requests of a node-loss test through to a 503 from the empty view).
FIRST_SNAPSHOT_WAIT_S = 15.0
OTHER = "other"  # the metric label of a value a client chose that the pool does not know
PD_HANDOFFS = "ray_epp_pd_handoffs_total"


class _Stream(StreamingResponse):
    """A streaming response that runs `on_close` once it is over, however it ends (finished,
    failed, client gone, or never started)."""

    def __init__(self, content: Any, on_close: Any, **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self._on_close = [on_close]

    def then(self, on_close: Any) -> None:
        """Run `on_close` too once the stream is over (after the ones given before)."""
        self._on_close.append(on_close)

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            for on_close in self._on_close:
                on_close()


class GatewayCore:
    """Everything a replica does, independent of Serve's decorators (so it can be tested and
    benchmarked on its own)."""

    def __init__(
        self,
        config: dict,
        settings: dict,
        datastore: Any,
        profile_actors: dict[str, Any],
        hub: Any | None,
        decision_log: Any = None,
    ) -> None:
        """`decision_log`: the DecisionLog actor the replicas share (None: each replica keeps its
        own decision record, when `decision_record_ratio` asks for one)."""
        cfg = load_config(config)
        placed = build_for(cfg, Placement.GATEWAY)
        built = placed.built
        self.handler = built.handler
        self.profiles = {p.name: p.name for p in cfg.scheduling_profiles}  # handles are opaque to the handler
        self.settings = GatewaySettings.model_validate(settings)
        s = self.settings
        self.detectors = admission_detectors(
            placed.plugins, s.saturation_queue_depth, s.saturation_kv_cache, named=built.saturation_detector
        )
        # The plugins placed in a gateway replica (scheduler/config/placement.py) and admission's
        # default detector hear this replica's own traffic: ledger-keeping detectors, ResponseHeader
        # plugins (a response never waits for a profile actor), ResponseUsage plugins.
        self.lifecycle = Lifecycle([*placed.plugins, *self.detectors])
        # Responders answer some routes here (models-responder: GET /v1/models), in config order.
        self.responders = self.lifecycle.having(Responder)
        # DataPreparers (burst-prefix-cache-producer) run here, where this replica's requests arrive.
        self.preparation = DataPreparation(self.lifecycle.plugins)
        # False when no plugin wants usage: responses are then not parsed for it.
        self.wants_usage = self.lifecycle.hears(LifecycleEvent.RESPONSE_USAGE)
        self.recorder = MetricsRecorder()
        self.datastore = datastore  # also the shared store of the Responses API's pins
        self.view = EndpointView(datastore, min_interval_s=s.snapshot_min_interval_s)
        self.runner: RayProfileRunner | LocalProfileRunner
        if s.decide_in_replica:  # the profiles run here, on this replica's view of the pool
            self.runner = LocalProfileRunner(
                built.profiles, lambda: self.view.endpoints, self.recorder.plugin_timer, self.lifecycle.plugins
            )
            bind_plugin_metrics(built.plugins.values(), self.recorder)  # the prefix indexer's families
        else:
            self.runner = RayProfileRunner(
                profile_actors,
                built.body_fields,  # what of a body the actors get: what the config's plugins declare
                s.shard_key_tokens, s.shard_session_header,
                call_timeout_s=s.profile_call_timeout_s,
                recorder=self.recorder,
                failover_after_s=s.profile_failover_after_s,
            )
        # Requests waiting at a pod the view sees leave and the datastore finds unhealthy move on.
        self.forwarder = Forwarder(s.connect_timeout_s, s.upstream_timeout_s, s.first_byte_timeout_s, self.view)
        self.intake = RequestIntake(s)
        self.decisions = (
            DecisionRecorder(s.decision_record_ratio, s.decision_record_size, decision_log, f"gateway-{os.getpid()}")
            if s.decision_record_ratio > 0
            else None
        )
        self.admin = AdminApi(s.admin_token, datastore, self.decisions)
        self.metrics = GatewayMetrics(
            self.recorder, self.model_label, self.priority_label, lambda: self.intake.in_flight
        )
        # With the flowControl gate on, requests wait in this replica's queue instead of a 429.
        fc = build_flow_controller(
            cfg, built.plugins, self.detectors, window=s.flow_dispatch_window, narrow_at=s.flow_dispatch_narrow_at
        )
        self.flow = (
            None
            if fc is None
            else FlowGate(fc, lambda: self.view.endpoints, self.recorder, self.model_label, self.priority_label)
        )
        self.hub = hub
        self.tracing = request_tracing(s)  # None: tracing off (serve_app/gateway/tracing.py)
        self.pusher = MetricsPusher(self.recorder, f"gateway-{os.getpid()}", hub) if hub is not None else None
        self._started = False

    async def ensure_ready(self) -> None:
        """Start the snapshot watcher; a replica's first request waits (briefly) for its first
        snapshot instead of answering 503 / 404 from an empty view."""
        self.ensure_started()
        if not self.view.has_first:
            await self.view.wait_first(FIRST_SNAPSHOT_WAIT_S)

    def ensure_started(self) -> None:
        if not self._started:
            self._started = True
            self.view.start()
            if self.decisions is not None:
                self.decisions.start()
            if self.pusher is not None:
                self.pusher.start()

    # ---- scheduling -------------------------------------------------------------------------
    async def schedule(self, request: LLMRequest, trace: SchedulingTrace | None = None) -> SchedulingResult:
        start = time.perf_counter()
        result: SchedulingResult | None = None
        failure: SchedulingError | None = None
        recorded = self.decisions is not None and self.decisions.samples(request.request_id)
        if recorded and trace is None:
            trace = SchedulingTrace()
        cycle_state = CycleState()
        try:
            if self.preparation:  # e.g. a burst window: it batches this replica's arrivals
                await self.preparation.run(cycle_state, request, self.view.endpoints)
            result = await schedule_cycles(
                self.handler,
                self.profiles,
                self.runner,
                request,
                None,
                cycle_state,
                trace,
                self.recorder.plugin_timer,
            )
            return result
        except SchedulingError as err:
            failure = err
            self.runner.withdraw(request)
            raise
        except BaseException:  # cancelled (the client left) or a bug: the decisions made are not used
            self.runner.withdraw(request)
            raise
        finally:
            self.metrics.scheduled(request, result, time.perf_counter() - start, cycle_state, self.handler)
            if recorded and (result is not None or failure is not None):
                self.decisions.record(request, result, trace, failure)  # type: ignore[union-attr]

    def known_models(self) -> set[str] | None:
        """Models some pod serves (None: do not check): what pods list, plus adapters they run."""
        if not self.settings.reject_unknown_models or not self.view.models:
            return None
        return self.view.models | self.view.adapters

    def model_label(self, request: LLMRequest) -> str:
        """A model name as a metric label: only names the pool serves, so clients can not grow
        /metrics by naming models."""
        model = request.target_model
        return model if model in self.view.models or model in self.view.adapters else OTHER

    def priority_label(self, priority: int) -> str:
        """A priority as a metric label: 0 or an objective's priority, else "other"."""
        if priority == 0 or priority in self.settings.objectives.values():
            return str(priority)
        return OTHER

    # ---- what stateful plugins learn: the profile actors', and this replica's own detectors ----
    # A queued request may be dispatchable after each of these (the ledger detectors moved).
    def tell_pre_request(self, request: LLMRequest, result: SchedulingResult) -> None:
        self.runner.pre_request(request, result)
        self.lifecycle.pre_request(request, result)
        self.settle(request)

    def tell_first_token(self, request: LLMRequest, endpoint_name: str) -> None:
        self.runner.response_first_token(request, endpoint_name)
        self.lifecycle.response_first_token(request, endpoint_name)
        if self.flow is not None:
            self.flow.pump()

    def tell_complete(self, request: LLMRequest, endpoint_name: str) -> None:
        self.runner.response_complete(request, endpoint_name)
        self.lifecycle.response_complete(request, endpoint_name)
        if self.flow is not None:
            self.flow.pump()

    def settle(self, request: LLMRequest) -> None:
        if self.flow is not None:
            self.flow.settle(request)

    async def admit(self, request: LLMRequest, http: Request | None = None, size: int = 0) -> None:
        """With flow control: wait in the queue (GatewayError if the request leaves it undispatched).
        Without: no endpoint 503; sheddable while the pool is saturated 429 at once."""
        if self.flow is not None:
            await self.flow.admit(request, http, size)
            return
        if not self.view.endpoints:
            raise GatewayError(503, "no ready model server in the pool", code=ErrorCode.SERVICE_UNAVAILABLE.value)
        if request.sheddable and pool_saturated(self.detectors, self.view.endpoints):
            raise GatewayError(
                429, "the pool is saturated; sheddable request shed", code=ErrorCode.RESOURCE_EXHAUSTED.value
            )

    # ---- the request path both doors share (HTTP here, Envoy ext_proc in serve_app/extproc/) ----
    async def enter(self, parsed: ParsedRequest, http: Request | None, size: int, started: float | None = None) -> None:
        """A parsed request is counted and admitted (flow control's queue, or shed / no pod at
        once); GatewayError when it is not. The caller settles it after its decision. `started`:
        perf_counter() when it reached the door (default: now)."""
        req = parsed.llm_request
        self.metrics.received(req, size, started)
        await self.admit(req, http, size)

    async def decide(
        self, req: LLMRequest, trace: SchedulingTrace | None, failed_before: str | None = None
    ) -> SchedulingResult:
        """Schedule an admitted request and tell the plugins the decision (PreRequest); the caller
        then owes them its end (`Exchange.close`, or `tell_complete`). `failed_before`: why the
        endpoints excluded by a retry failed, for the 503 when no other one is left."""
        try:
            result = await self.schedule(req, trace)
        except SchedulingError as err:
            if failed_before is not None:  # every candidate failed us
                raise GatewayError(
                    503,
                    f"no endpoint could serve the request: {failed_before}; then: {err.message}",
                    code=ErrorCode.SERVICE_UNAVAILABLE.value,
                ) from None
            raise GatewayError.from_scheduling(err) from None
        self.tell_pre_request(req, result)
        self.metrics.decided(req)
        return result

    def count_error(self, req: LLMRequest | None, err: GatewayError) -> None:
        self.metrics.error(req, err.code)
        if self.tracing is not None and (spans := current_spans()) is not None:
            spans.error(err.status, err.code)

    async def handle(self, http: Request, path: str, route: RouteHooks | None = None) -> Response:
        started = time.perf_counter()
        try:
            self.intake.check_head(http)
            client = self.intake.client_of_http(http)
            admission = self.intake.enter(client)
        except GatewayError as err:
            self.count_error(None, err)
            return err.response() if route is None else route.error_response(err)
        response: Response | None = None
        req: LLMRequest | None = None
        spans = (self.tracing.begin(http.headers, path) if self.tracing is not None else None) or NO_SPANS
        try:
            raw = await self.intake.read_body(http, client)
            await self.ensure_ready()
            parsed = parse_request(raw, dict(http.headers), path, self.settings, self.known_models())
            if route is not None:
                await route.prepare(parsed)
            req = parsed.llm_request
            spans.admission(req)
            await self.enter(parsed, http, len(raw), started)
            trace = SchedulingTrace() if self.intake.wants_trace(http) else None
            response = await self._schedule_and_forward(parsed, path, raw, trace, started, route)
            return response
        except GatewayError as err:
            self.count_error(req, err)
            return err.response() if route is None else route.error_response(err)
        finally:
            if req is not None:
                self.settle(req)  # a dispatched request whose scheduling failed
            if isinstance(response, _Stream):  # a stream leaves when it ends
                response.then(admission.leave)
            else:
                admission.leave()
                spans.finish(None if response is None else response.status_code)

    async def _schedule_and_forward(
        self,
        parsed: ParsedRequest,
        path: str,
        raw: bytes,
        trace: SchedulingTrace | None,
        started: float,
        route: RouteHooks | None = None,
    ) -> Response:
        req = parsed.llm_request
        excluded: set[str] = set()
        last_error = ""
        spans = current_spans() or NO_SPANS
        for _attempt in range(self.settings.max_retries + 1):
            spans.schedule(_attempt)
            result = await self.decide(req, trace, last_error if excluded else None)
            spans.decided(result)
            target = result.target
            headers = dict(parsed.forward_headers)
            body = raw
            if result.prefill_profile_name is not None and path in PD_PATHS:
                spans.prefill(result, headers)
                body = await self.pd_hand_off(req, result, path, raw, headers, trace)
            spans.forward(target, headers)
            try:
                upstream = await self.forwarder.open(target, path, body, headers, stream=parsed.stream)
            except UpstreamUnavailable as err:
                spans.failed(str(err))
                last_error = str(err)
                excluded.add(target.name)
                req.excluded_endpoints = req.excluded_endpoints | excluded  # a route's own exclusions stay
                self.tell_complete(req, target.name)
                continue
            return await self._respond(parsed, result, upstream, trace, started, route)
        raise GatewayError(
            503,
            f"no endpoint could serve the request after retries: {last_error}",
            code=ErrorCode.SERVICE_UNAVAILABLE.value,
        )

    async def pd_hand_off(
        self,
        req: LLMRequest,
        result: SchedulingResult,
        path: str,
        raw: bytes,
        headers: dict,
        trace: SchedulingTrace | None,
        mode: str | None = None,
    ) -> bytes:
        """The P/D hand-off: run the prefill step (or name the prefiller for a sidecar); returns the
        body to send to the decode pod and adds the headers it needs. `mode` overrides `pd_mode`
        (the ext_proc door, which forwards nothing itself, always names the prefiller)."""
        s = self.settings
        try:
            hand = await hand_off(
                self.forwarder,
                result,
                req.body,
                path,
                headers,
                mode or s.pd_mode,
                s.pd_prefill_retries,
                s.pd_prefill_failure,
            )
        except GatewayError:
            self.recorder.inc(PD_HANDOFFS, ("failed",))
            raise
        self.recorder.inc(PD_HANDOFFS, (hand.decision,))  # pd, decode-only or pd-fallback
        headers.update(hand.headers)
        if trace is not None:
            trace.extra["pd"] = hand.trace()
        return hand.body if hand.body is not None else raw

    async def _respond(
        self, parsed, result: SchedulingResult, upstream, trace, started: float, route: RouteHooks | None = None
    ) -> Response:
        req = parsed.llm_request
        target = result.target
        headers = response_headers(upstream)
        headers.update(self.lifecycle.response_headers(req, result))
        headers[DESTINATION_HEADER] = target.host_port
        if self.decisions is not None and not any(k.lower() == REQUEST_ID_HEADER for k in headers):
            headers[REQUEST_ID_HEADER] = req.request_id  # what `epp explain` asks for
        if trace is not None:
            headers["x-epp-trace"] = json.dumps({**result.to_json(), "trace": trace.to_json()}, separators=(",", ":"))
        is_sse = parsed.stream and upstream.status == 200
        if upstream.status >= 400:  # the model server's own error: counted with its status, as GIE does
            self.metrics.error(req, str(upstream.status))
        exchange = Exchange.open(self, req, target.name, started, streaming=is_sse)
        tap = route if route is not None and upstream.status == 200 else None
        if not is_sse:
            try:
                body = await upstream.read()
                if tap is not None:
                    await tap.answered(target.name, body)
                exchange.chunk(body)
                exchange.end(upstream.status == 200)
            finally:
                upstream.release()
                exchange.close()
            return Response(body, status_code=upstream.status, headers=headers)

        async def stream():
            async for chunk in relay(upstream, is_sse=True, idle_timeout_s=self.settings.stream_idle_timeout_s):
                if tap is not None:
                    await tap.answered(target.name, chunk)
                exchange.chunk(chunk)
                yield chunk
            exchange.end(True)  # the stream ended whole: its usage before its completion frees the queue

        def on_close() -> None:
            upstream.release()  # also when the stream never started (client gone first)
            exchange.close()

        return _Stream(stream(), on_close, status_code=upstream.status, headers=headers)
