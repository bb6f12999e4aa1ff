"""OpenTelemetry traces of a request, end to end: real Ray actors (ray_epp/configs/pd.yaml: a
prefill and a decode profile actor), simulated prefill and decode pods on 127.0.0.1 that record the
headers they get, and a gateway (GatewayCore, the replica's request path, served by its own FastAPI
app in this process) whose tracer exports to the OpenTelemetry SDK's in-memory exporter. The span
tree of each request is checked: the client's trace continued, a span per phase, each profile run
timed in its actor under the context carried across the Ray call, the traceparent reaching the
pod. A real Serve gateway of the same deployment, tracing on, sends the pod (both pods of a P/D
request) the client's trace."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import httpx
import pytest
from fastapi import FastAPI, Request  # module level: the route's annotation must resolve

from tests.serve_app.deployments import TRACED_PD

pytestmark = pytest.mark.ray
sdk = pytest.importorskip("opentelemetry.sdk.trace", reason="the `tracing` extra is not installed")

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
LONG = "The quick brown fox studies distributed systems and writes long essays about them. " * 40
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


def client_traceparent(trace_id: str = TRACE_ID) -> str:
    return f"00-{trace_id}-{CLIENT_SPAN}-01"


# The Serve gateway traces every request and propagates the context (no collector to export to).
# test_extproc_tracing.py runs against the same setup.
E2E_SETUP = TRACED_PD


@pytest.fixture(scope="module")
def deployment(gateway):
    return gateway


def headers_seen(sim, pod: str) -> list[tuple[str, dict[str, str]]]:
    return list(next(p for p in sim.pods if p.name == pod)._pod.request_headers)


class Gateway:
    """A GatewayCore on the deployment's actors, tracing into an in-memory exporter, behind a
    FastAPI app of its own (the replica's routes that forward)."""

    def __init__(self, deployment, ratio: float = 1.0) -> None:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

        from scheduler import dump_config, load_config_file
        from serve_app.gateway.core import GatewayCore
        from serve_app.gateway.tracing import RequestTracing

        config = dump_config(load_config_file("pd"))
        self.core = GatewayCore(config, {}, deployment.actors.datastore, deployment.actors.shards, None)
        assert self.core.tracing is None  # off by default
        self.exporter = InMemorySpanExporter()
        provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(ratio)))
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.core.tracing = RequestTracing(ratio, "test", provider=provider)
        app = FastAPI()

        @app.post("/v1/completions")
        async def completions(request: Request):
            return await self.core.handle(request, "/v1/completions")

        self.app = app

    def spans(self, trace_id: str) -> list:
        return [s for s in self.exporter.get_finished_spans() if f"{s.context.trace_id:032x}" == trace_id]


async def post(gw: Gateway, body: dict, headers: dict | None = None) -> httpx.Response:
    transport = httpx.ASGITransport(app=gw.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
        await gw.core.ensure_ready()
        return await client.post("/v1/completions", json={"model": MODEL, "max_tokens": 4, **body}, headers=headers)


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


def test_a_request_is_one_trace_continuing_the_clients(deployment, sim):
    async def main():
        gw = Gateway(deployment)
        resp = await post(gw, {"prompt": "Hello there, a short prompt."}, {"traceparent": client_traceparent()})
        assert resp.status_code == 200, resp.text
        await gw.core.view.stop()
        return gw

    gw = asyncio.run(main())
    spans = gw.spans(TRACE_ID)
    assert tree(spans) == {
        "POST /v1/completions": ["ray_epp.admission", "ray_epp.forward", "ray_epp.schedule"],
        "ray_epp.admission": [],
        "ray_epp.schedule": ["ray_epp.pick", "ray_epp.profile decode"],
        "ray_epp.profile decode": [],
        "ray_epp.pick": [],
        "ray_epp.forward": [],
    }
    root = named(spans, "POST /v1/completions")
    assert f"{root.parent.span_id:016x}" == CLIENT_SPAN and root.parent.is_remote  # the client's trace
    assert root.kind.name == "SERVER" and root.attributes["http.response.status_code"] == 200
    assert root.attributes["ray_epp.endpoint"] == "decode-0"
    # the profile ran in its actor (another process), timed there, under the context it was sent
    profile = named(spans, "ray_epp.profile decode")
    assert profile.attributes["ray_epp.actor.pid"] != os.getpid()
    assert profile.attributes["ray_epp.endpoint"] == "decode-0"
    schedule = named(spans, "ray_epp.schedule")
    assert profile.parent.span_id == schedule.context.span_id and profile.parent.is_remote
    assert named(spans, "ray_epp.pick").attributes["ray_epp.endpoint"] == "decode-0"
    forward = named(spans, "ray_epp.forward")
    assert forward.kind.name == "CLIENT" and [e.name for e in forward.events] == ["first_token"]
    for span in spans:
        assert root.start_time <= span.start_time <= span.end_time <= root.end_time, span.name
    # the pod got the forward span's traceparent: the same trace, the forward as its parent
    _, sent = headers_seen(sim, "decode-0")[-1]
    assert sent["traceparent"] == f"00-{TRACE_ID}-{forward.context.span_id:016x}-01"


def test_a_pd_request_traces_the_prefill_and_decode_hops(deployment, sim):
    trace_id = "11112222333344445555666677778888"

    async def main():
        gw = Gateway(deployment)
        body = {"prompt": "[pd] " + LONG, "stream": True, "stream_options": {"include_usage": True}}
        resp = await post(gw, body, {"traceparent": client_traceparent(trace_id)})
        assert resp.status_code == 200, resp.text
        await gw.core.view.stop()
        return gw

    gw = asyncio.run(main())
    spans = gw.spans(trace_id)
    t = tree(spans)
    assert t["POST /v1/completions"] == [
        "ray_epp.admission",
        "ray_epp.pd.decode",
        "ray_epp.pd.prefill",
        "ray_epp.schedule",
    ]
    assert t["ray_epp.schedule"] == ["ray_epp.pick", "ray_epp.profile decode", "ray_epp.profile prefill"]
    root = named(spans, "POST /v1/completions")
    assert f"{root.parent.span_id:016x}" == CLIENT_SPAN and root.parent.is_remote  # the client's trace
    prefill, decode = named(spans, "ray_epp.pd.prefill"), named(spans, "ray_epp.pd.decode")
    assert prefill.attributes["ray_epp.endpoint"] == "prefill-0" and decode.attributes["ray_epp.endpoint"] == "decode-0"
    assert prefill.end_time <= decode.start_time
    assert [e.name for e in decode.events] == ["first_token"]  # the stream's first chunk
    # each hop's pod got its own span as the parent
    _, to_prefill = headers_seen(sim, "prefill-0")[-1]
    _, to_decode = headers_seen(sim, "decode-0")[-1]
    assert to_prefill["traceparent"] == f"00-{trace_id}-{prefill.context.span_id:016x}-01"
    assert to_decode["traceparent"] == f"00-{trace_id}-{decode.context.span_id:016x}-01"


def test_without_a_client_trace_a_new_one_starts_and_errors_are_marked(deployment, sim):
    async def main():
        gw = Gateway(deployment)
        ok = await post(gw, {"prompt": "No trace of mine."})
        missing = await post(gw, {"prompt": "x", "model": "no-such-model"})
        await gw.core.view.stop()
        return gw, ok, missing

    gw, ok, missing = asyncio.run(main())
    assert ok.status_code == 200 and missing.status_code == 404
    roots = [s for s in gw.exporter.get_finished_spans() if s.name == "POST /v1/completions"]
    assert len(roots) == 2 and all(r.parent is None for r in roots)
    assert roots[0].context.trace_id != roots[1].context.trace_id
    refused = roots[1]
    assert refused.attributes["http.response.status_code"] == 404
    assert refused.attributes["error.type"] == "model_not_found"
    refused_spans = gw.spans(f"{refused.context.trace_id:032x}")
    assert {s.name for s in refused_spans} == {"POST /v1/completions"}  # refused before admission


def test_an_unsampled_request_forwards_the_clients_traceparent_as_it_came(deployment, sim):
    async def main():
        gw = Gateway(deployment, ratio=0.0)  # nothing sampled here, nor by the client (flags 00)
        resp = await post(gw, {"prompt": "Not sampled."}, {"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-00"})
        await gw.core.view.stop()
        return gw, resp

    gw, resp = asyncio.run(main())
    assert resp.status_code == 200 and gw.exporter.get_finished_spans() == ()
    _, sent = headers_seen(sim, "decode-0")[-1]
    assert sent["traceparent"] == f"00-{TRACE_ID}-{CLIENT_SPAN}-00"


def test_the_serve_gateway_sends_the_pod_the_clients_trace(deployment, sim):
    trace_id = "aaaabbbbccccddddeeeeffff00001111"
    with httpx.Client(base_url=deployment.url, timeout=60) as client:
        resp = client.post(
            "/v1/completions",
            json={"model": MODEL, "prompt": "Through Serve.", "max_tokens": 3},
            headers={"traceparent": client_traceparent(trace_id)},
        )
    assert resp.status_code == 200, resp.text
    _, sent = headers_seen(sim, "decode-0")[-1]
    version, got_trace, parent, flags = sent["traceparent"].split("-")
    assert (version, got_trace, flags) == ("00", trace_id, "01")
    assert parent != CLIENT_SPAN  # the gateway's forward span, not the client's


def test_the_serve_gateway_sends_both_pd_pods_the_clients_trace(deployment, sim):
    trace_id = "99998888777766665555444433332222"
    with httpx.Client(base_url=deployment.url, timeout=60) as client:
        resp = client.post(
            "/v1/completions",
            # a prompt no pod has cached: the decider sends it to prefill (a cached one goes decode-only)
            json={
                "model": MODEL,
                "prompt": "[pd] " + "Serve carries this long prompt to both pods. " * 60,
                "max_tokens": 3,
            },
            headers={"traceparent": client_traceparent(trace_id)},
        )
    assert resp.status_code == 200, resp.text
    parents = []
    for pod in ("prefill-0", "decode-0"):
        _, sent = headers_seen(sim, pod)[-1]
        version, got_trace, parent, flags = sent["traceparent"].split("-")
        assert (version, got_trace, flags) == ("00", trace_id, "01"), pod
        parents.append(parent)
    assert CLIENT_SPAN not in parents and parents[0] != parents[1]  # the prefill hop's span, then the decode's


def test_tracing_off_imports_no_opentelemetry():
    code = (
        "import sys\n"
        "from serve_app.gateway.settings import GatewaySettings\n"
        "from serve_app.gateway.tracing import request_tracing\n"
        "assert request_tracing(GatewaySettings()) is None\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('opentelemetry'))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", "import json\n" + code], capture_output=True, text=True, check=True, timeout=60
    )
    assert json.loads(out.stdout) == []
