"""GIE's Endpoint Picker Protocol end to end: a real Ray EPP (actors + Serve gateway) serving both
doors, HTTP and ext_proc, in front of simulated vLLM pods on 127.0.0.1. The tests drive the
ext_proc service as Envoy's ext_proc filter does, message by message (tests/serve_app/extproc/
envoy.py), send the request to the endpoint it returned and feed the response back; decisions are
compared with the HTTP door's on the same deployment (shared profile actors, one request path).
The deployment of test_gateway_e2e.py too (BOTH_DOORS); the test that stops every pod runs after
both modules' others."""

from __future__ import annotations

import json
import threading
import time

import grpc
import httpx
import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.serve_app.deployments import BOTH_DOORS, in_flight, wait_until
from tests.serve_app.extproc.envoy import Stream, decide, headers_message, respond, stub_for, through_envoy

pytestmark = pytest.mark.ray

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
E2E_SETUP = BOTH_DOORS
COMPLETIONS = "/v1/completions"


@pytest.fixture(scope="module")
def channel(gateway):
    ch, stub = stub_for(gateway.ext_proc_address)
    yield ch, stub
    ch.close()


@pytest.fixture()
def stub(channel):
    return channel[1]


def body(prompt: str, **extra) -> bytes:
    return json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 2, **extra}).encode()


def pod_of(host_port: str, sim) -> str:
    return next(p.name for p in sim.pods if host_port == f"127.0.0.1:{p.port}")


def http_pick(client, prompt: str, sim, **headers) -> str:
    resp = client.post(COMPLETIONS, content=body(prompt), headers={"content-type": "application/json", **headers})
    assert resp.status_code == 200, resp.text
    return pod_of(resp.headers["x-gateway-destination-endpoint"], sim)


def test_the_pick_goes_out_as_header_and_metadata_and_the_response_comes_back(stub, sim):
    sent = body("Hello through Envoy")
    out = through_envoy(stub, COMPLETIONS, sent)
    assert out.immediate_status is None
    assert out.destination == out.metadata_destination  # never different
    assert pod_of(out.endpoint, sim)
    assert out.forwarded_body == sent  # the body goes on unchanged
    assert out.status == 200
    assert json.loads(out.body)["choices"][0]["text"]
    assert out.response_set["x-gateway-destination-endpoint"] == out.endpoint


def test_a_streamed_response_passes_chunk_by_chunk(stub):
    out = through_envoy(stub, COMPLETIONS, body("Stream it", max_tokens=8, stream=True))
    assert out.status == 200
    events = [line for line in out.body.decode().splitlines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and len(events) >= 3


def test_chat_completions_are_picked_too(stub):
    chat = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode()
    out = through_envoy(stub, "/v1/chat/completions", chat)
    assert out.status == 200 and json.loads(out.body)["choices"]


def test_prefix_stickiness_is_one_state_for_both_doors(client, stub, sim):
    """A prefix first seen by one door brings the next request at the other door to the same pod:
    both run the same request path, with the same profile actors' prefix index."""
    for first_door in ("http", "ext_proc"):
        shared = f"You are a meticulous assistant for the {first_door} door. " * 100
        if first_door == "http":
            home = http_pick(client, shared + "Q0", sim)
        else:
            home = pod_of(through_envoy(stub, COMPLETIONS, body(shared + "Q0")).endpoint, sim)
        time.sleep(0.2)
        via_ext_proc = [pod_of(through_envoy(stub, COMPLETIONS, body(shared + f"Q{i}")).endpoint, sim) for i in (1, 2)]
        via_http = [http_pick(client, shared + f"Q{i}", sim) for i in (3, 4)]
        assert via_ext_proc + via_http == [home] * 4, first_door


def test_the_subset_hint_restricts_the_pick(stub, sim):
    allowed = f"127.0.0.1:{sim.pods[2].port}"
    for i in range(4):
        out = through_envoy(stub, COMPLETIONS, body(f"subset {i}"), subset=[allowed, "10.9.9.9:8000"])
        assert out.destination == allowed == out.metadata_destination
        assert out.status == 200


@pytest.mark.parametrize(
    ("subset", "fragment"),
    [([], "lists no endpoint"), (["127.0.0.1:1"], "is a ready endpoint of the pool")],
)
def test_an_empty_or_ineligible_subset_is_503(stub, subset, fragment):
    out = through_envoy(stub, COMPLETIONS, body("nowhere"), subset=subset)
    assert out.immediate_status == 503
    error = json.loads(out.immediate_body)["error"]
    assert error["code"] == "ServiceUnavailable" and fragment in error["message"]
    assert out.immediate_headers["content-type"] == "application/json"


def test_routing_headers_from_the_client_are_removed(stub):
    out = through_envoy(stub, COMPLETIONS, body("sneaky"), headers={"x-prefiller-host-port": "127.0.0.1:9"})
    assert "x-prefiller-host-port" in out.request_removed
    assert "x-prefiller-host-port" not in out.request_set


@pytest.mark.parametrize(
    ("path", "content", "status", "fragment"),
    [
        (COMPLETIONS, b"{not json", 400, "not valid JSON"),
        (COMPLETIONS, json.dumps({"prompt": "no model"}).encode(), 400, "'model' is required"),
        ("/v1/fine_tuning/jobs", body("x"), 404, "not an inference route"),
        (COMPLETIONS, body("x" * 300_000), 413, "exceeds the limit"),
    ],
)
def test_bad_requests_get_the_http_doors_errors(stub, path, content, status, fragment):
    stream = Stream(stub)
    try:
        out = decide(stream, path, content)
    finally:
        stream.cancel()
    assert out.immediate_status == status
    error = json.loads(out.immediate_body)["error"]
    assert fragment in error["message"] and set(error) == {"message", "type", "param", "code"}


def test_a_request_without_body_goes_to_a_ready_endpoint(stub, sim):
    stream = Stream(stub)
    try:
        get = {":method": "GET", ":path": "/v1/models", ":authority": "gateway.local"}
        stream.send(pb.ProcessingRequest(request_headers=headers_message(get, end_of_stream=True)))
        answer = stream.recv()
    finally:
        stream.cancel()
    mutation = answer.request_headers.response.header_mutation
    picked = {h.header.key: h.header.raw_value.decode() for h in mutation.set_headers}
    assert pod_of(picked["x-gateway-destination-endpoint"], sim)


def test_health_services_as_the_protocol_defines_them(channel):
    health = health_pb2_grpc.HealthStub(channel[0])
    serving = health_pb2.HealthCheckResponse.SERVING
    for service in ("", "liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor"):
        assert health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status == serving
    with pytest.raises(grpc.RpcError) as err:
        health.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=10)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_streams_cancelled_mid_way_leave_no_in_flight_entry(stub, gateway, sim):
    """Envoy gives up on streams at every step: before the body ends, after the pick, after the
    response headers, in the middle of a streamed response. None leaves an entry in the ledgers."""
    wait_until(lambda: in_flight(gateway) == 0, timeout_s=20)
    long = body("cancel me " * 400, max_tokens=50, stream=True)
    post = {":method": "POST", ":path": COMPLETIONS}
    for step in ("mid-body", "picked", "response-headers", "mid-response"):
        for i in range(3):
            stream = Stream(stub)
            if step == "mid-body":
                stream.send(pb.ProcessingRequest(request_headers=headers_message(post)))
                stream.send(pb.ProcessingRequest(request_body=pb.HttpBody(body=long[:100], end_of_stream=False)))
                time.sleep(0.05)
            else:
                out = decide(stream, COMPLETIONS, long)
                assert out.immediate_status is None
                if i == 0 and step != "mid-response":  # the decision is in the ledger while it runs
                    wait_until(lambda: in_flight(gateway) >= 1, timeout_s=5, every_s=0.02)
                if step != "picked":
                    _cancel_during_response(stream, out, step)
            stream.cancel()
        wait_until(lambda: in_flight(gateway) == 0, timeout_s=20)


def _cancel_during_response(stream: Stream, out, step: str) -> None:
    with (
        httpx.Client(timeout=60) as http,
        http.stream("POST", f"http://{out.endpoint}{COMPLETIONS}", content=out.forwarded_body) as resp,
    ):
        headers = {":status": str(resp.status_code), "content-type": resp.headers["content-type"]}
        stream.send(pb.ProcessingRequest(response_headers=headers_message(headers)))
        stream.recv()
        if step == "mid-response":
            chunk = next(resp.iter_raw())
            stream.send(pb.ProcessingRequest(response_body=pb.HttpBody(body=chunk)))
            stream.recv()


def test_a_fallback_that_served_takes_the_requests_place(stub, gateway, sim):
    """The data plane says another endpoint served (it retried on a fallback): the ledgers move the
    request there, and release it when the response ends."""
    wait_until(lambda: in_flight(gateway) == 0, timeout_s=20)
    stream = Stream(stub)
    try:
        out = decide(stream, COMPLETIONS, body("fallback", max_tokens=4))
        other = next(f"127.0.0.1:{p.port}" for p in sim.pods if f"127.0.0.1:{p.port}" != out.endpoint)
        respond(stream, out, COMPLETIONS, served=other)
        assert out.response_set["x-gateway-destination-endpoint"] == other
        stream.half_close()
        assert stream.rest() == []
    finally:
        stream.cancel()
    wait_until(lambda: in_flight(gateway) == 0, timeout_s=20)


def test_sheddable_is_shed_with_429_at_both_doors_and_critical_is_picked(client, stub, sim):
    with httpx.Client(timeout=120) as direct:

        def hammer(url):
            direct.post(f"{url}{COMPLETIONS}", json={"model": MODEL, "prompt": "load", "max_tokens": 300})

        threads = [threading.Thread(target=hammer, args=(p.url,), daemon=True) for p in sim.pods for _ in range(10)]
        for t in threads:
            t.start()
        wait_until(lambda: all(p.snapshot()["waiting_queue_size"] >= 5 for p in sim.pods), timeout_s=10)
        time.sleep(0.3)
        batch = {"x-gateway-inference-objective": "batch"}
        shed_http = client.post(COMPLETIONS, content=body("x"), headers={"content-type": "application/json", **batch})
        stream = Stream(stub)
        try:
            shed = decide(stream, COMPLETIONS, body("x"), headers=batch)
        finally:
            stream.cancel()
        assert shed_http.status_code == shed.immediate_status == 429
        assert json.loads(shed.immediate_body) == shed_http.json()
        stream = Stream(stub)
        try:
            critical = decide(stream, COMPLETIONS, body("x"), headers={"x-gateway-inference-objective": "chat"})
        finally:
            stream.cancel()
        assert critical.immediate_status is None and pod_of(critical.endpoint, sim)
        for t in threads:
            t.join()


@pytest.mark.spends_e2e_setup(2)  # every pod: after the tests that spend less
def test_zz_no_ready_pod_is_503_at_both_doors(client, stub, channel, sim):
    """Runs last: stops every pod."""
    for p in sim.pods:
        p.stop()
    wait_until(lambda: client.get("/ready").status_code == 503, timeout_s=20)
    http = client.post(COMPLETIONS, content=body("x"), headers={"content-type": "application/json"})
    out = through_envoy(stub, COMPLETIONS, body("x"))
    assert http.status_code == out.immediate_status == 503
    assert json.loads(out.immediate_body)["error"]["type"] == http.json()["error"]["type"] == "service_unavailable"
    health = health_pb2_grpc.HealthStub(channel[0])
    readiness = health.Check(health_pb2.HealthCheckRequest(service="readiness"), timeout=10).status
    assert readiness == health_pb2.HealthCheckResponse.NOT_SERVING
    liveness = health.Check(health_pb2.HealthCheckRequest(service="liveness"), timeout=10).status
    assert liveness == health_pb2.HealthCheckResponse.SERVING
