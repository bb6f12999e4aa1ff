"""OpenTelemetry traces through the ext_proc door: a stream is one trace continuing the
`traceparent` Envoy passes on from the client, with the HTTP door's spans (serve_app/gateway/tracing.py),
and the pod gets the forward span's context in the header mutation Envoy applies. Real Ray actors
(ray_epp/configs/pd.yaml: a prefill and a decode profile actor) and simulated prefill and decode
pods that record the headers they get; the ext_proc service runs in this process on a GatewayCore
that exports to the OpenTelemetry SDK's in-memory exporter, driven as Envoy drives it."""

from __future__ import annotations

import asyncio
import json
import os
import threading

import pytest

from tests.serve_app.deployments import TRACED_PD, wait_until
from tests.serve_app.extproc.envoy import Stream, decide, stub_for, through_envoy

pytestmark = pytest.mark.ray
sdk = pytest.importorskip("opentelemetry.sdk.trace", reason="the `tracing` extra is not installed")

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
LONG = "The quick brown fox studies distributed systems and writes long essays about them. " * 40
CLIENT_SPAN = "00f067aa0ba902b7"


# The actors of test_tracing.py's setup (this module drives them through a door of its own).
E2E_SETUP = TRACED_PD


@pytest.fixture(scope="module")
def deployment(gateway):
    return gateway


class TracedDoor:
    """The ext_proc service on a GatewayCore of the deployment's actors, tracing every stream into
    an in-memory exporter, served on 127.0.0.1 by a gRPC server on an event loop of its own."""

    def __init__(self, deployment) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.address = asyncio.run_coroutine_threadsafe(self._start(deployment), self.loop).result(60)

    async def _start(self, deployment) -> str:
        import grpc
        from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        from scheduler import dump_config, load_config_file
        from serve_app.extproc.service import ExternalProcessor
        from serve_app.gateway.core import GatewayCore
        from serve_app.gateway.tracing import RequestTracing

        config = dump_config(load_config_file("pd"))
        self.core = GatewayCore(config, {}, deployment.actors.datastore, deployment.actors.shards, None)
        self.exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.core.tracing = RequestTracing(1.0, "test", provider=provider)
        await self.core.ensure_ready()
        self.server = grpc.aio.server()
        pb_grpc.add_ExternalProcessorServicer_to_server(ExternalProcessor(self.core), self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        return f"127.0.0.1:{port}"

    async def _stop(self) -> None:
        await self.server.stop(1)
        await self.core.view.stop()

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    def spans(self, trace_id: str) -> list:
        return [s for s in self.exporter.get_finished_spans() if f"{s.context.trace_id:032x}" == trace_id]


@pytest.fixture(scope="module")
def door(deployment):
    d = TracedDoor(deployment)
    channel, d.stub = stub_for(d.address)
    yield d
    channel.close()
    d.stop()


def tree(spans: list) -> dict[str, list[str]]:
    """Each span's name -> its children's names (sorted)."""
    by_id = {s.context.span_id: s for s in spans}
    out: dict[str, list[str]] = {s.name: [] for s in spans}
    for s in spans:
        if s.parent is not None and s.parent.span_id in by_id:
            out[by_id[s.parent.span_id].name].append(s.name)
    return {k: sorted(v) for k, v in out.items()}


def named(spans: list, name: str):
    [span] = [s for s in spans if s.name == name]
    return span


def last_headers(sim, pod: str) -> dict[str, str]:
    return next(p for p in sim.pods if p.name == pod)._pod.request_headers[-1][1]


def body(prompt: str, **extra) -> bytes:
    return json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 4, **extra}).encode()


def test_a_stream_is_one_trace_continuing_the_clients(door, sim):
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    out = through_envoy(door.stub, "/v1/completions", body("Hello"), {"traceparent": f"00-{trace_id}-{CLIENT_SPAN}-01"})
    assert out.status == 200
    spans = door.spans(trace_id)
    assert tree(spans) == {
        "POST /v1/completions": ["ray_epp.admission", "ray_epp.forward", "ray_epp.schedule"],
        "ray_epp.admission": [],
        "ray_epp.schedule": ["ray_epp.pick", "ray_epp.profile decode"],
        "ray_epp.profile decode": [],
        "ray_epp.pick": [],
        "ray_epp.forward": [],
    }
    root = named(spans, "POST /v1/completions")
    assert f"{root.parent.span_id:016x}" == CLIENT_SPAN and root.parent.is_remote
    assert root.kind.name == "SERVER" and root.attributes["http.response.status_code"] == 200
    assert root.attributes["ray_epp.endpoint"] == "decode-0"
    profile = named(spans, "ray_epp.profile decode")
    assert profile.attributes["ray_epp.actor.pid"] != os.getpid()  # timed in its actor
    forward = named(spans, "ray_epp.forward")
    assert forward.kind.name == "CLIENT" and [e.name for e in forward.events] == ["first_token"]
    for span in spans:
        assert root.start_time <= span.start_time <= span.end_time <= root.end_time, span.name
    # the header mutation carries the forward span's context: Envoy sends it to the pod
    expected = f"00-{trace_id}-{forward.context.span_id:016x}-01"
    assert out.request_set["traceparent"] == expected
    assert last_headers(sim, "decode-0")["traceparent"] == expected


def test_a_pd_stream_traces_the_prefill_and_decode_hops(door):
    trace_id = "11112222333344445555666677778888"
    out = through_envoy(
        door.stub,
        "/v1/completions",
        body("[ext_proc pd] " + LONG, stream=True),  # uncached: test_tracing.py's pods are these
        {"traceparent": f"00-{trace_id}-{CLIENT_SPAN}-01"},
    )
    assert out.status == 200 and "x-prefiller-host-port" in out.request_set
    spans = door.spans(trace_id)
    assert tree(spans)["POST /v1/completions"] == [
        "ray_epp.admission",
        "ray_epp.pd.decode",
        "ray_epp.pd.prefill",
        "ray_epp.schedule",
    ]
    decode = named(spans, "ray_epp.pd.decode")
    assert [e.name for e in decode.events] == ["first_token"]  # the stream's first chunk
    assert out.request_set["traceparent"] == f"00-{trace_id}-{decode.context.span_id:016x}-01"


def test_an_immediate_response_marks_the_root_span(door):
    trace_id = "aaaabbbbccccddddeeeeffff00001111"
    stream = Stream(door.stub)
    try:
        out = decide(
            stream,
            "/v1/completions",
            body("x", model="no-such-model"),
            {"traceparent": f"00-{trace_id}-{CLIENT_SPAN}-01"},
        )
    finally:
        stream.cancel()
    assert out.immediate_status == 404

    def root():
        spans = door.spans(trace_id)
        return spans[0] if spans else None

    span = wait_until(root, timeout_s=10)  # the root ends when the stream closes
    assert span.name == "POST /v1/completions" and span.attributes["error.type"] == "model_not_found"
    assert span.attributes["http.response.status_code"] == 404
