"""OpenTelemetry traces of the gateway's requests (the `tracing` extra; `tracing_sample_ratio` in
the gateway settings). One trace per sampled request:

    <method> <route>                 SERVER, continues the client's W3C traceparent
    ├── ray_epp.admission            the door's checks and flow control's queue wait
    ├── ray_epp.schedule             one per attempt (a retry schedules again)
    │   ├── ray_epp.profile <name>   each profile run, timed in its profile actor
    │   └── ray_epp.pick             the handler's choice and PreRequest, with the endpoint
    ├── ray_epp.pd.prefill           P/D: the prefill hop (traceparent sent to the prefill pod)
    └── ray_epp.forward              CLIENT, to the model server (ray_epp.pd.decode in P/D); its
                                     `first_token` event is the TTFT; traceparent sent to the pod

The schedule span's traceparent rides in each ProfileCall across the Ray call (or the same-node
channel); the profile actor times its run and sends the context back with its answer, and the
span is exported here, so the actors need no exporter of their own. With the ratio at 0 (the
default) nothing here is built and opentelemetry is never imported; a request that is not sampled
costs one sampling decision and forwards the client's traceparent as it came."""

from __future__ import annotations

import contextvars
import time
from typing import Any

_CURRENT: contextvars.ContextVar[RequestSpans | None] = contextvars.ContextVar("ray_epp_request_spans", default=None)
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"


def current_spans() -> RequestSpans | None:
    """The spans of the request this task serves (None: not traced)."""
    return _CURRENT.get()


def request_tracing(settings: Any) -> RequestTracing | None:
    """The replica's tracing for its settings; None when tracing is off."""
    if settings.tracing_sample_ratio <= 0:
        return None
    return RequestTracing(
        settings.tracing_sample_ratio,
        settings.tracing_service_name,
        settings.tracing_otlp_endpoint,
        export=settings.tracing_exporter == "otlp",
    )


class RequestTracing:
    """A replica's tracer. `provider`: an SDK TracerProvider to use instead of building one (its
    own sampler and exporters then apply); without it, a provider sampling `ratio` of the traces
    that start here (a client's sampled traceparent is always followed) and exporting by OTLP/HTTP
    to `endpoint` (None: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / OTEL_EXPORTER_OTLP_ENDPOINT, else
    http://localhost:4318); `export` False: none (spans are made and propagated only)."""

    def __init__(
        self, ratio: float, service_name: str, endpoint: str | None = None, provider: Any = None, export: bool = True
    ) -> None:
        try:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
            from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        except ImportError as err:
            raise ValueError(
                f"tracing_sample_ratio > 0 needs OpenTelemetry: pip install 'ray-epp[tracing]' ({err})"
            ) from None
        import ray_epp

        if provider is None:
            resource = Resource.create({"service.name": service_name, "service.version": ray_epp.__version__})
            provider = TracerProvider(resource=resource, sampler=ParentBased(TraceIdRatioBased(ratio)))
            if export:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
                from opentelemetry.sdk.trace.export import BatchSpanProcessor

                exporter = OTLPSpanExporter(endpoint=endpoint) if endpoint else OTLPSpanExporter()
                provider.add_span_processor(BatchSpanProcessor(exporter))

        self.provider = provider
        self.tracer = provider.get_tracer("ray_epp.gateway", ray_epp.__version__)
        self.propagator = TraceContextTextMapPropagator()
        self.SERVER, self.CLIENT, self.INTERNAL = SpanKind.SERVER, SpanKind.CLIENT, SpanKind.INTERNAL
        self.Status, self.ERROR = Status, StatusCode.ERROR
        self.in_context = set_span_in_context

    def begin(self, headers: Any, path: str, method: str = "POST") -> RequestSpans | None:
        """The request's root span, continuing the client's traceparent; None when not sampled.
        Sets the task's current spans either way (a task serves one request)."""
        parent = self.propagator.extract({k: headers[k] for k in (TRACEPARENT, TRACESTATE) if k in headers})
        root = self.tracer.start_span(
            f"{method} {path}",
            context=parent,
            kind=self.SERVER,
            attributes={"http.request.method": method, "http.route": path, "url.path": path},
        )
        spans = RequestSpans(self, root) if root.is_recording() else None
        _CURRENT.set(spans)
        return spans

    def shutdown(self) -> None:
        self.provider.shutdown()


class RequestSpans:
    """One sampled request's spans. Its phases follow one another: starting one ends the one
    before, and the request's end ends the last (also one a failure left open)."""

    __slots__ = ("_done", "_first", "_last_profile_end", "_pd", "_phase", "_schedule", "_t", "root")

    def __init__(self, tracing: RequestTracing, root: Any) -> None:
        self._t = tracing
        self.root = root
        self._phase: Any = None
        self._schedule: Any = None
        self._last_profile_end = 0
        self._first = True
        self._done = False
        self._pd = False  # this attempt ran a prefill hop

    # ---- phases ---------------------------------------------------------------------------------
    def phase(self, name: str, kind: Any = None, **attributes: Any) -> Any:
        """Start a child phase of the request (ending the open one); returns its span."""
        self._end_phase()
        span = self._t.tracer.start_span(
            name, context=self._t.in_context(self.root), kind=kind or self._t.INTERNAL, attributes=attributes or None
        )
        self._phase = span
        if name == "ray_epp.schedule":
            self._schedule, self._last_profile_end, self._pd = span, 0, False
        return span

    def admission(self, request: Any) -> None:
        self.root.set_attribute("gen_ai.request.model", request.target_model)
        self.root.set_attribute("ray_epp.request_id", request.request_id)
        self.phase("ray_epp.admission")

    def schedule(self, attempt: int) -> None:
        self.phase("ray_epp.schedule", **{"ray_epp.attempt": attempt})

    def profile_traceparent(self) -> str | None:
        """The traceparent a ProfileCall carries to its actor: the schedule span's."""
        if self._schedule is None:
            return None
        ctx = self._schedule.get_span_context()
        return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"

    def profile_run(self, name: str, shard: int, outcome: Any) -> None:
        """A profile actor's run, as the actor timed it, under the context it was sent."""
        span_info = getattr(outcome, "span", None)
        now = time.time_ns()
        parent = self._schedule
        ctx = (
            self._t.propagator.extract({TRACEPARENT: span_info["traceparent"]})
            if span_info
            else self._t.in_context(parent)
        )
        start = int(outcome.started * 1e9) if outcome.started else now
        end = int(outcome.finished * 1e9) if outcome.finished else now
        attributes: dict[str, Any] = {"ray_epp.profile": name, "ray_epp.shard": shard}
        if span_info:
            attributes["ray_epp.actor.pid"] = span_info.get("pid", 0)
            attributes["ray_epp.endpoints"] = span_info.get("endpoints", 0)
            attributes["ray_epp.snapshot_version"] = outcome.snapshot_version
        if outcome.result is not None and outcome.result.target_endpoints:
            attributes["ray_epp.endpoint"] = outcome.result.target_endpoints[0].name
        span = self._t.tracer.start_span(
            f"ray_epp.profile {name}", context=ctx, start_time=start, attributes=attributes
        )
        if outcome.error is not None:
            span.set_status(self._t.Status(self._t.ERROR, str(outcome.error)))
        span.end(end_time=max(end, start))
        self._last_profile_end = max(self._last_profile_end, end)

    def decided(self, result: Any) -> None:
        """The pick: from the last profile run's end to the decision told to the plugins."""
        target = result.target
        start = self._last_profile_end or time.time_ns()
        span = self._t.tracer.start_span(
            "ray_epp.pick",
            context=self._t.in_context(self._schedule or self.root),
            start_time=min(start, time.time_ns()),
            attributes={
                "ray_epp.endpoint": target.name,
                "server.address": target.address,
                "server.port": target.port,
                "ray_epp.profile": result.primary_profile_name or "",
                "ray_epp.prefill_profile": result.prefill_profile_name or "",
            },
        )
        span.end()
        self.root.set_attribute("ray_epp.endpoint", target.name)

    def prefill(self, result: Any, headers: dict[str, str]) -> None:
        """The P/D prefill hop, when the decision has a prefill target (the decider may have said
        decode-only); the prefill pod gets its traceparent."""
        prefill = result.profile_results.get(result.prefill_profile_name)
        if prefill is None or not prefill.target_endpoints:
            return
        self._pd = True
        attributes = {
            "ray_epp.profile": result.prefill_profile_name,
            "ray_epp.endpoint": prefill.target_endpoints[0].name,
        }
        self._inject(self.phase("ray_epp.pd.prefill", self._t.CLIENT, **attributes), headers)

    def forward(self, target: Any, headers: dict[str, str]) -> None:
        """The hop to the model server (the decode pod after a prefill); the pod gets its traceparent."""
        name = "ray_epp.pd.decode" if self._pd else "ray_epp.forward"
        attributes = {"ray_epp.endpoint": target.name, "server.address": target.address, "server.port": target.port}
        self._inject(self.phase(name, self._t.CLIENT, **attributes), headers)

    def _inject(self, span: Any, headers: dict[str, str]) -> None:
        headers.pop(TRACESTATE, None)
        self._t.propagator.inject(headers, context=self._t.in_context(span))

    def failed(self, message: str) -> None:
        """The open phase failed (e.g. the endpoint did not answer; a retry follows)."""
        if self._phase is not None:
            self._phase.set_status(self._t.Status(self._t.ERROR, message))
        self._end_phase()

    # ---- the response ---------------------------------------------------------------------------
    def chunk(self) -> None:
        """A piece of the response went by: the first one is the forward's `first_token` event."""
        if self._first:
            self._first = False
            if self._phase is not None:
                self._phase.add_event("first_token")

    def error(self, status: int, code: str) -> None:
        """The request ends in the gateway's own error (GatewayError)."""
        self.root.set_attribute("error.type", code)
        self.root.set_attribute("http.response.status_code", status)
        if status >= 500:
            self.root.set_status(self._t.Status(self._t.ERROR, code))

    def finish(self, status: int | None = None) -> None:
        """The request is over (its response sent, or its stream closed): end every span. Once."""
        if self._done:
            return
        self._done = True
        if status is not None:
            self.root.set_attribute("http.response.status_code", status)
            if status >= 500:
                self.root.set_status(self._t.Status(self._t.ERROR, str(status)))
        self._end_phase()
        self.root.end()

    def _end_phase(self) -> None:
        if self._phase is not None:
            self._phase.end()
            self._phase = None


class NoSpans:
    """What the request path calls when the request is not traced: nothing happens."""

    __slots__ = ()

    def __bool__(self) -> bool:
        return False

    def admission(self, request: Any) -> None:
        pass

    def schedule(self, attempt: int) -> None:
        pass

    def decided(self, result: Any) -> None:
        pass

    def prefill(self, result: Any, headers: dict[str, str]) -> None:
        pass

    def forward(self, target: Any, headers: dict[str, str]) -> None:
        pass

    def failed(self, message: str) -> None:
        pass

    def finish(self, status: int | None = None) -> None:
        pass


NO_SPANS = NoSpans()
