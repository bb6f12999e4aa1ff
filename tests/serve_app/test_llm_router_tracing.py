"""The Serve LLM router's spans: EPPRequestRouter in a real Serve, over simulated LLM replicas
(bench/serve_llm_replica.py), called through a handle from this process (so its router runs here),
its tracer exporting to the OpenTelemetry SDK's in-memory exporter. A `ray_epp.choose_replicas`
span per decision, naming the replica Serve then sent the request to; the request's trace
continued from the context Serve puts in its metadata (as Serve does when its own tracing is on:
the request is built here with that context and given to the live router); a fallback marked."""

from __future__ import annotations

import asyncio
import time

import pytest
from ray import serve
from ray.serve.config import RequestRouterConfig

from bench.serve_llm_replica import FakeLLMServer

pytestmark = pytest.mark.ray
pytest.importorskip("opentelemetry.sdk.trace", reason="the `tracing` extra is not installed")

APP = "llm-router-tracing-test"
CONFIG = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
  - pluginRef: kv-cache-utilization-scorer
"""
NO_ENDPOINT_CONFIG = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: label-selector-filter
  parameters:
    matchLabels:
      no-replica-has: this-label
- type: queue-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: label-selector-filter
  - pluginRef: queue-scorer
"""
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
SERVE_SPAN = "b7ad6b7169203331"  # Serve's route_to_replica span, the router's parent


def deployment(name: str, config: str, replicas: int):
    kwargs = {"config": config, "tracing": {"sample_ratio": 1.0, "exporter": "none"}}
    return serve.deployment(
        FakeLLMServer,
        name=name,
        num_replicas=replicas,
        max_ongoing_requests=8,
        ray_actor_options={"num_cpus": 0},
        request_router_config=RequestRouterConfig(
            request_router_class="serve_app.llm_router:EPPRequestRouter", request_router_kwargs=kwargs
        ),
    ).bind()


def chat(text: str) -> dict:
    return {"model": "base", "messages": [{"role": "user", "content": text}], "max_tokens": 3}


@pytest.fixture(scope="module")
def traced(ray_session):
    """name -> (handle, its router in this process, the in-memory exporter its tracer feeds)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from serve_app.gateway.tracing import RequestTracing
    from serve_app.llm_router.router import routers

    out = {}
    for name, config, replicas in (("TracedLLM", CONFIG, 2), ("NoEndpointLLM", NO_ENDPOINT_CONFIG, 1)):
        serve.run(deployment(name, config, replicas), name=f"{APP}-{name}", route_prefix=f"/{APP}-{name}")
        handle = serve.get_deployment_handle(name, app_name=f"{APP}-{name}")
        handle.whoami.remote().result(timeout_s=60)  # the router exists, with its tracer
        [router] = [r for r in routers() if r._deployment_id.name == name]
        assert router.tracing is not None  # built from the kwarg
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        router.tracing = RequestTracing(1.0, "test", provider=provider)
        out[name] = (handle, router, exporter)
    yield out
    from actors.launcher import stop_router_profile_actors
    from serve_app.llm_router.router import ROUTER_NAMESPACE, read_config

    for name, config in (("TracedLLM", CONFIG), ("NoEndpointLLM", NO_ENDPOINT_CONFIG)):
        serve.delete(f"{APP}-{name}")
        stop_router_profile_actors(read_config(config), namespace=ROUTER_NAMESPACE)


def choose_spans(exporter) -> list:
    return [s for s in exporter.get_finished_spans() if s.name == "ray_epp.choose_replicas"]


def test_each_decision_is_a_span_naming_the_replica_it_chose(traced):
    handle, _, exporter = traced["TracedLLM"]
    exporter.clear()
    served = [handle.chat.remote(chat(f"question {i}")).result(timeout_s=30)["replica"] for i in range(4)]
    spans = choose_spans(exporter)
    assert len(spans) >= 4
    for span in spans[-4:]:
        assert span.parent is None  # Serve's tracing is off here: each decision starts a trace
        assert span.attributes["ray_epp.serve.deployment"] == "TracedLLM"
        assert span.attributes["ray_epp.candidates"] == 2
        assert span.attributes["gen_ai.request.model"] == "base"
        assert span.attributes["ray_epp.profile"] == "default"
        assert "ray_epp.fallback" not in span.attributes
    assert [s.attributes["ray_epp.replica"] for s in spans[-4:]] == served


def test_the_router_continues_the_trace_serve_gives_it(traced):
    from ray.serve._private.common import RequestMetadata
    from ray.serve._private.request_router.common import PendingRequest

    _, router, exporter = traced["TracedLLM"]
    exporter.clear()

    async def choose():
        metadata = RequestMetadata(
            request_id="client-request-7",
            internal_request_id="internal-7",
            call_method="chat",
            tracing_context={"traceparent": f"00-{TRACE_ID}-{SERVE_SPAN}-01"},
        )
        pending = PendingRequest(args=[chat("traced question")], kwargs={}, metadata=metadata)
        return await router.choose_replicas(list(router.curr_replicas.values()), pending)

    ranked = asyncio.run_coroutine_threadsafe(choose(), router._event_loop).result(timeout=30)
    [span] = choose_spans(exporter)
    assert f"{span.context.trace_id:032x}" == TRACE_ID
    assert f"{span.parent.span_id:016x}" == SERVE_SPAN and span.parent.is_remote
    assert span.attributes["ray_epp.serve.request_id"] == "client-request-7"
    assert span.attributes["ray_epp.serve.internal_request_id"] == "internal-7"
    assert span.attributes["ray_epp.replica"] == ranked[0][0].replica_id.unique_id
    assert span.end_time >= span.start_time


def test_a_fallback_is_marked_on_the_span(traced):
    handle, _, exporter = traced["NoEndpointLLM"]
    exporter.clear()
    replica = handle.chat.remote(chat("no endpoint for me")).result(timeout_s=30)["replica"]
    assert replica  # Serve's own choice served it
    deadline = time.monotonic() + 5
    while not choose_spans(exporter) and time.monotonic() < deadline:
        time.sleep(0.05)
    span = choose_spans(exporter)[-1]
    assert span.attributes["ray_epp.fallback"].startswith("scheduling_")
    assert [e.name for e in span.events] == ["fallback"]
    assert "ray_epp.replica" not in span.attributes


def test_router_tracing_settings_are_checked():
    from serve_app.llm_router.tracing import router_tracing

    assert router_tracing(None) is None and router_tracing({"sample_ratio": 0}) is None
    with pytest.raises(ValueError, match="unknown keys"):
        router_tracing({"sample_ratio": 0.5, "ratio": 1})
    with pytest.raises(ValueError, match="exporter"):
        router_tracing({"sample_ratio": 0.5, "exporter": "zipkin"})
