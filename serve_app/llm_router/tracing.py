"""OpenTelemetry spans of the Serve LLM router's decisions (`EPPRequestRouter(tracing=...)`): one
`ray_epp.choose_replicas` span per `choose_replicas` call, the scheduler's decision over the
deployment's replicas (on the router's local mirror: no actor call to follow).

Its parent is the request's trace where Serve gives one: with Serve's own tracing on, Serve's
`route_to_replica` span, whose context Serve puts in the request's metadata
(`RequestMetadata.tracing_context`) before it asks the router; without it, a new trace (sampled
at `sample_ratio`). Attributes: the deployment, Serve's request ids, the candidates, the model,
the chosen replica and profile, and the fallback's reason when the scheduler could not decide
(Serve's power of two choices then routes it). Off by default; the settings are the gateway's
(serve_app/gateway/tracing.py): `{"sample_ratio": 0.1, "otlp_endpoint": ..., "exporter": "otlp" | "none",
"service_name": "ray-epp-router"}`."""

from __future__ import annotations

from typing import Any

from serve_app.gateway.tracing import TRACEPARENT, TRACESTATE, RequestTracing
from serve_app.llm_router.router_config import RouterConfigError

SPAN_NAME = "ray_epp.choose_replicas"


def router_tracing(settings: dict[str, Any] | None) -> RequestTracing | None:
    """The router's tracer for its `tracing` kwarg; None when off (no ratio, or 0). A bad setting
    is a RouterConfigError: the router refuses it as it refuses a bad config (each request fails
    with it)."""
    settings = dict(settings or {})
    ratio = float(settings.pop("sample_ratio", 0.0))
    exporter = settings.pop("exporter", "otlp")
    endpoint = settings.pop("otlp_endpoint", None)
    service = settings.pop("service_name", "ray-epp-router")
    if settings or exporter not in ("otlp", "none") or not 0 <= ratio <= 1:
        raise RouterConfigError(
            f"EPPRequestRouter tracing: unknown keys {sorted(settings)} or a bad value (sample_ratio in "
            f"[0, 1], exporter 'otlp' or 'none'); got ratio {ratio}, exporter {exporter!r}"
        )
    if ratio <= 0:
        return None
    try:
        return RequestTracing(ratio, service, endpoint, export=exporter == "otlp")
    except ValueError as err:  # the `tracing` extra is not installed
        raise RouterConfigError(f"EPPRequestRouter tracing: {err}") from None


class ChooseSpan:
    """One choose_replicas call's span."""

    __slots__ = ("_t", "span")

    def __init__(self, tracing: RequestTracing, span: Any) -> None:
        self._t, self.span = tracing, span

    @classmethod
    def begin(cls, tracing: RequestTracing | None, pending_request: Any, candidates: list, deployment: str):
        """The call's span under the request's Serve trace context; None when not traced."""
        if tracing is None:
            return None
        metadata = pending_request.metadata
        carrier = {k: v for k, v in (metadata.tracing_context or {}).items() if k in (TRACEPARENT, TRACESTATE)}
        span = tracing.tracer.start_span(
            SPAN_NAME,
            context=tracing.propagator.extract(carrier),
            kind=tracing.INTERNAL,
            attributes={
                "ray_epp.serve.deployment": deployment,
                "ray_epp.serve.request_id": metadata.request_id,
                "ray_epp.serve.internal_request_id": metadata.internal_request_id,
                "ray_epp.candidates": len(candidates),
            },
        )
        return cls(tracing, span) if span.is_recording() else None

    def chose(self, ranked: list[list[Any]], decision: Any) -> None:
        """The ranks returned to Serve (best first); `decision`: the remembered (request, result, t)."""
        self.span.set_attribute("ray_epp.replica", ranked[0][0].replica_id.unique_id)
        self.span.set_attribute("ray_epp.ranks", len(ranked))
        if decision is not None:
            request, result = decision[0], decision[1]
            self.span.set_attribute("gen_ai.request.model", request.target_model)
            if result is not None:
                self.span.set_attribute("ray_epp.profile", result.primary_profile_name or "")

    def fell_back(self, reason: str, detail: str) -> None:
        """The scheduler could not decide: Serve's power of two choices routes the request."""
        self.span.set_attribute("ray_epp.fallback", reason)
        self.span.add_event("fallback", {"reason": reason, "detail": detail[:500]})

    def end(self) -> None:
        self.span.end()
