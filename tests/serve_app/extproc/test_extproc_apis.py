"""Every API the HTTP door routes, through the ext_proc door: the path and the body tell the parser
which API a request is (the same token views and route hooks as the HTTP door), and both doors
share one state (Responses API pins in the datastore, LoRA residency in the profile actors). Real
Ray EPP (ray_epp/configs/lora.yaml) in front of simulated vLLM pods serving three adapters; the
tests drive ext_proc as Envoy does (tests/serve_app/extproc/envoy.py) and send each request to the
endpoint it returned."""

from __future__ import annotations

import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

from scheduler.config.source import config_source
from tests.conftest import GATEWAY_TEST_PORT
from tests.serve_app.deployments import sim_pods, start_deployment, wait_until
from tests.serve_app.extproc.envoy import Stream, decide, stub_for, through_envoy

pytestmark = pytest.mark.ray

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
ADAPTERS = ["lora-a", "lora-b", "lora-c"]
LOAD_BODIES = {  # the body each API routed by load needs (serve_app/gateway/api_views.py, LOAD_VIEWS)
    "/v1/embeddings": {"input": ["a", "b"]},
    "/pooling": {"input": "a"},
    "/classify": {"input": "a"},
    "/score": {"text_1": "q", "text_2": ["a"]},
    "/v1/score": {"text_1": "q", "text_2": "a"},
    "/rerank": {"query": "q", "documents": ["a", "b"]},
    "/v1/rerank": {"query": "q", "documents": ["a"]},
    "/v2/rerank": {"query": "q", "documents": ["a"]},
    "/tokenize": {"prompt": "hello world!"},
    "/detokenize": {"tokens": [1751477356]},
}


# The shipped LoRA config, except that an adapter is never spread to a free slot for its share of
# the traffic (`spread: 1.5` may give the test's one busy adapter a second pod when load differs):
# an adapter's home is then where every next request goes, whichever door it comes through.
NO_SPREAD_LORA = config_source("lora")[0].replace("spread: 1.5", "spread: 0.1")


@pytest.fixture(scope="module")
def sim():
    yield from sim_pods(3, seed=17, max_num_seqs=8, lora_adapters=ADAPTERS, max_loras=2)


@pytest.fixture(scope="module")
def gateway(ray_session, sim):
    dep = start_deployment(sim, NO_SPREAD_LORA, ext_proc_port=GATEWAY_TEST_PORT + 3)
    yield dep
    dep.stop()


@pytest.fixture(scope="module")
def stub(gateway):
    channel, stub = stub_for(gateway.ext_proc_address)
    yield stub
    channel.close()


def js(**body) -> bytes:
    return json.dumps(body).encode()


def pod_of_response(response_id: str) -> str:
    """The simulator names its responses `resp_<pod>-<n>`."""
    return response_id.removeprefix("resp_").rsplit("-", 1)[0]


def name_of(host_port: str, sim) -> str:
    return next(p.name for p in sim.pods if host_port == f"127.0.0.1:{p.port}")


def test_every_load_routed_api_is_picked_and_served(stub, sim):
    from serve_app.gateway.api_views import FORM_PATHS, LOAD_VIEWS

    assert set(LOAD_BODIES) == set(LOAD_VIEWS) - FORM_PATHS
    for path, extra in LOAD_BODIES.items():
        out = through_envoy(stub, path, js(model=MODEL, **extra))
        assert out.immediate_status is None and out.status == 200, (path, out.immediate_body, out.body)
        assert name_of(out.endpoint, sim)
    embeddings = through_envoy(stub, "/v1/embeddings", js(model=MODEL, input=["alpha"]))
    from ray_epp.simulator.pooling_api import vector

    assert json.loads(embeddings.body)["data"][0]["embedding"] == pytest.approx(vector("alpha"))


def test_speech_to_text_forms_are_picked_and_forwarded_whole(stub, sim):
    """A multipart form (the model read from its fields), as the HTTP door routes it."""
    import httpx

    from ray_epp.simulator.audio_api import transcript

    audio = bytes(range(256)) * 16
    for path, task in (("/v1/audio/transcriptions", "transcribe"), ("/v1/audio/translations", "translate")):
        form = httpx.Request("POST", "http://x" + path, data={"model": MODEL}, files={"file": ("clip.wav", audio)})
        content_type = form.headers["content-type"]
        out = through_envoy(stub, path, form.read(), headers={"content-type": content_type})
        assert out.status == 200, (out.immediate_body, out.body)
        assert json.loads(out.body)["text"] == transcript(audio, task) and name_of(out.endpoint, sim)


def test_a_malformed_load_routed_body_is_the_http_doors_400(client, stub):
    http = client.post("/v1/rerank", json={"model": MODEL, "query": "q"})
    stream = Stream(stub)
    try:
        out = decide(stream, "/v1/rerank", js(model=MODEL, query="q"))
    finally:
        stream.cancel()
    assert http.status_code == out.immediate_status == 400
    assert json.loads(out.immediate_body) == http.json() and http.json()["error"]["param"] == "documents"


def test_a_responses_conversation_stays_on_its_pod_across_both_doors(client, stub, sim):
    """Turns alternate between the doors: the pins are the datastore's, so a follow-up finds its
    pod whichever door (and replica) it reaches; a streamed turn is pinned as it goes by."""
    first = through_envoy(stub, "/v1/responses", js(model=MODEL, input="first turn " * 20, max_output_tokens=3))
    assert first.status == 200, first.body
    previous = json.loads(first.body)["id"]
    pod = pod_of_response(previous)
    assert name_of(first.endpoint, sim) == pod
    for i in range(4):
        body = {"model": MODEL, "input": f"turn {i}", "previous_response_id": previous, "max_output_tokens": 3}
        if i % 2:
            resp = client.post("/v1/responses", json=body)
            assert resp.status_code == 200, resp.text
            previous = resp.json()["id"]
        else:
            out = through_envoy(stub, "/v1/responses", js(**body, stream=True))
            assert out.status == 200 and name_of(out.endpoint, sim) == pod
            events = [json.loads(line[6:]) for line in out.body.decode().splitlines() if line.startswith("data: ")]
            assert events[-1]["type"] == "response.completed"
            previous = events[-1]["response"]["id"]
        assert pod_of_response(previous) == pod
    # the stored response, read and deleted through the ext_proc door at the pod that made it
    got = through_envoy(stub, f"/v1/responses/{previous}", None, method="GET")
    assert got.status == 200 and json.loads(got.body)["id"] == previous and name_of(got.endpoint, sim) == pod
    cancel = through_envoy(stub, f"/v1/responses/{previous}/cancel", None)  # the pod's own answer
    assert cancel.status == 400 and "synchronous" in cancel.body.decode() and name_of(cancel.endpoint, sim) == pod
    gone = through_envoy(stub, f"/v1/responses/{previous}", None, method="DELETE")
    assert gone.status == 200
    after = client.get(f"/v1/responses/{previous}")  # the pin went with it
    assert after.status_code == 404 and after.json()["error"]["code"] == "response_not_found"


def test_an_unknown_previous_response_is_the_http_doors_404(client, stub):
    body = {"model": MODEL, "input": "x", "previous_response_id": "resp_never-made"}
    http = client.post("/v1/responses", json=body)
    stream = Stream(stub)
    try:
        out = decide(stream, "/v1/responses", js(**body))
    finally:
        stream.cancel()
    assert http.status_code == out.immediate_status == 404
    error = json.loads(out.immediate_body)["error"]
    assert error == http.json()["error"] and error["code"] == "response_not_found"
    assert error["param"] == "previous_response_id"
    unknown = through_envoy(stub, "/v1/responses/resp_never-made", None, method="GET")
    assert unknown.immediate_status == 404 and json.loads(unknown.immediate_body)["error"]["param"] == "response_id"


def test_anthropic_messages_are_picked_and_their_errors_are_in_anthropics_shape(client, stub):
    body = {"model": MODEL, "max_tokens": 4, "system": "be brief", "messages": [{"role": "user", "content": "hi"}]}
    out = through_envoy(stub, "/v1/messages", js(**body, stream=True))
    assert out.status == 200 and "message_stop" in out.body.decode()
    count = through_envoy(stub, "/v1/messages/count_tokens", js(model=MODEL, messages=body["messages"]))
    assert count.status == 200 and json.loads(count.body)["input_tokens"] > 0
    bad = {"model": MODEL, "max_tokens": 4, "messages": []}
    http = client.post("/v1/messages", json=bad)
    stream = Stream(stub)
    try:
        refused = decide(stream, "/v1/messages", js(**bad))
    finally:
        stream.cancel()
    assert http.status_code == refused.immediate_status == 400
    answer = json.loads(refused.immediate_body)
    assert answer == http.json() and answer["type"] == "error"
    assert answer["error"]["type"] == "invalid_request_error"
    assert refused.immediate_headers["content-type"] == "application/json"


def errors(client, code: str) -> float:
    """llm_d_epp_request_error_total with this error_code, on the gateway's /metrics."""
    for fam in text_string_to_metric_families(client.get("/metrics").text):
        if fam.name == "llm_d_epp_request_error":
            return sum(s.value for s in fam.samples if s.name.endswith("_total") and s.labels["error_code"] == code)
    return 0.0


def test_an_upstream_error_status_is_counted_as_the_http_door_counts_it(client, stub):
    """The pod answers 400 (an empty `documents`): the error counter gains one under "400" per
    door, the response passes through unchanged, and the request is no longer in flight."""
    before = errors(client, "400")
    body = {"model": MODEL, "query": "q", "documents": []}
    out = through_envoy(stub, "/v1/rerank", js(**body))
    assert out.immediate_status is None and out.status == 400
    assert json.loads(out.body)["error"]["param"] == "documents"  # the pod's own answer
    wait_until(lambda: errors(client, "400") >= before + 1)
    assert client.post("/v1/rerank", json={"model": MODEL, **body}).status_code == 400
    wait_until(lambda: errors(client, "400") >= before + 2)


def http_pick(client, sim, adapter: str, i: int, max_tokens: int = 2) -> str:
    body = {"model": adapter, "prompt": f"{adapter} request {i}", "max_tokens": max_tokens}
    resp = client.post("/v1/completions", json=body)
    assert resp.status_code == 200, resp.text
    return name_of(resp.headers["x-gateway-destination-endpoint"], sim)


def ext_proc_pick(stub, sim, adapter: str, i: int, max_tokens: int = 2) -> str:
    out = through_envoy(
        stub, "/v1/completions", js(model=adapter, prompt=f"{adapter} request {i}", max_tokens=max_tokens)
    )
    assert out.status == 200, (out.immediate_body, out.body)
    return name_of(out.endpoint, sim)


def running_adapters(sim) -> set[str]:
    """The adapters the pods' own /metrics list as running now."""
    import httpx

    running: set[str] = set()
    for pod in sim.pods:
        page = httpx.get(f"http://127.0.0.1:{pod.port}/metrics", timeout=5).text
        for fam in text_string_to_metric_families(page):
            if fam.name == "vllm:lora_requests_info":
                for sample in fam.samples:
                    running.update(a for a in sample.labels["running_lora_adapters"].split(",") if a)
    return running


def test_lora_affinity_is_one_state_for_both_doors(client, stub, sim):
    """An adapter's first request, at either door, makes its pod the adapter's home; its next
    requests go there at both doors (the lora-residency-scorer's record is the profile actors').

    A model counts as an adapter once a scrape has shown it running (the base model never shows),
    so the first request is a long one and the next are decided while it runs."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    homes = {}
    with ThreadPoolExecutor(1) as pool:
        for n, adapter in enumerate(ADAPTERS):
            first_door = "http" if n % 2 == 0 else "ext_proc"
            pick = http_pick if first_door == "http" else ext_proc_pick
            first = pool.submit(pick, client if first_door == "http" else stub, sim, adapter, 0, 400)
            wait_until(lambda a=adapter: a in running_adapters(sim), every_s=0.02)
            time.sleep(0.4)  # eight scrape intervals: the profile actors' pool shows it too
            picks = [ext_proc_pick(stub, sim, adapter, i) for i in (1, 2)] + [
                http_pick(client, sim, adapter, i) for i in (3, 4)
            ]
            home = first.result()
            assert picks == [home] * 4, (adapter, first_door, home, picks)
            homes[adapter] = home
    assert len(homes) == len(ADAPTERS)
