"""The product as users meet it: a real Ray Serve gateway, real actors, simulated vLLM pods on
127.0.0.1. The deployment of extproc/test_extproc_e2e.py too (BOTH_DOORS); the test that kills
every pod runs after both modules' others."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.serve_app.deployments import BOTH_DOORS, wait_until

pytestmark = pytest.mark.ray

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
E2E_SETUP = BOTH_DOORS
DEBUG = {"x-epp-debug": BOTH_DOORS.spec["settings"]["debug_token"]}
PROFILE_CALL_TIMEOUT_S = BOTH_DOORS.spec["settings"]["profile_call_timeout_s"]


def destination(resp: httpx.Response, sim) -> str:
    host_port = resp.headers["x-gateway-destination-endpoint"]
    return next(p.name for p in sim.pods if host_port.endswith(f":{p.port}"))




def test_completion_is_forwarded_with_destination(client, sim):
    resp = client.post("/v1/completions", json={"model": MODEL, "prompt": "Hello", "max_tokens": 5})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["choices"][0]["text"]
    assert destination(resp, sim) in {p.name for p in sim.pods}
    assert resp.headers["x-inference-pod"] == destination(resp, sim)


def test_health_ready_models_metrics(client):
    assert client.get("/health").status_code == 200
    ready = client.get("/ready")
    assert ready.status_code == 200 and ready.json()["ready_endpoints"] == 3
    assert MODEL in [m["id"] for m in client.get("/v1/models").json()["data"]]
    client.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 1})
    text = client.get("/metrics").text
    for name in (
        "inference_extension_scheduler_e2e_duration_seconds_bucket",
        "inference_objective_request_total",
        "inference_extension_plugin_duration_seconds",
        "inference_pool_average_kv_cache_utilization",
        "inference_pool_ready_pods",
    ):
        assert name in text, name


def test_streaming_arrives_incrementally(client):
    arrivals = []
    body = {"model": MODEL, "stream": True, "max_tokens": 40, "messages": [{"role": "user", "content": "hi"}]}
    with client.stream("POST", "/v1/chat/completions", json=body) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        for line in resp.iter_lines():
            if line.startswith("data: "):
                arrivals.append((time.monotonic(), line))
    assert arrivals[-1][1] == "data: [DONE]"
    assert len(arrivals) > 10
    # 40 tokens at several ms each: the first event must come well before the last.
    assert arrivals[-1][0] - arrivals[0][0] > 0.05


def test_openai_client_works(gateway):
    from openai import OpenAI

    oai = OpenAI(base_url=f"{gateway.url}/v1", api_key="unused")
    out = oai.completions.create(model=MODEL, prompt="Hello there", max_tokens=4)
    assert out.choices[0].text
    chunks = list(
        oai.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=6, stream=True
        )
    )
    assert any(c.choices and c.choices[0].delta.content for c in chunks)


def test_prefix_goes_back_to_the_pod_that_has_it(client, sim):
    shared = "You are a meticulous assistant. " * 120  # ~3,800 chars: ~60 prefix blocks
    first = client.post("/v1/completions", json={"model": MODEL, "prompt": shared + "Q0", "max_tokens": 2})
    assert first.status_code == 200
    home = destination(first, sim)
    time.sleep(0.2)
    later = [
        destination(
            client.post("/v1/completions", json={"model": MODEL, "prompt": shared + f"Q{i}", "max_tokens": 2}), sim
        )
        for i in range(1, 6)
    ]
    assert later == [home] * 5


@pytest.mark.parametrize(
    ("content", "headers", "status", "fragment"),
    [
        (b"{not json", {}, 400, "not valid JSON"),
        (json.dumps({"prompt": "x"}).encode(), {}, 400, "'model' is required"),
        (json.dumps({"model": "nope", "prompt": "x"}).encode(), {}, 404, "does not exist"),
        (json.dumps({"model": MODEL, "prompt": "x" * 1_200_000}).encode(), {}, 413, "exceeds the limit"),
        (
            json.dumps({"model": MODEL, "prompt": "x"}).encode(),
            {"x-gateway-inference-objective": "vip"},
            400,
            "unknown inference objective",
        ),
        (json.dumps({"model": MODEL}).encode(), {}, 400, "'prompt' is required"),
    ],
)
def test_bad_input_gets_openai_errors(client, content, headers, status, fragment):
    resp = client.post("/v1/completions", content=content, headers={"content-type": "application/json", **headers})
    assert resp.status_code == status
    err = resp.json()["error"]
    assert fragment in err["message"]
    assert set(err) == {"message", "type", "param", "code"}


def test_debug_header_returns_trace_and_pick_endpoint(client):
    resp = client.post("/v1/completions", json={"model": MODEL, "prompt": "trace me", "max_tokens": 1}, headers=DEBUG)
    trace = json.loads(resp.headers["x-epp-trace"])
    prof = trace["trace"]["profiles"]["default"]
    assert {s["type"] for s in prof["scorers"]} == {
        "load-aware-scorer",
        "kv-cache-utilization-scorer",
        "prefix-cache-scorer",
        "prefill-eta-scorer",
        "prefix-home-balance-scorer",
    }
    assert prof["picked"] == trace["profiles"]["default"]
    pick = client.post("/v1/pick", json={"model": MODEL, "prompt": "where would you go"})
    assert pick.status_code == 200
    assert pick.json()["primary_profile"] == "default"
    assert pick.headers["x-gateway-destination-endpoint"] == pick.json()["endpoints"]["default"][0]


def backlog_scores(client) -> dict[str, float]:
    """The default's in-flight ledger (prefill-eta-scorer): its scores for a fresh prompt, from the
    decision trace of /v1/pick."""
    pick = client.post("/v1/pick", json={"model": MODEL, "prompt": "fresh"}, headers=DEBUG)
    scorers = pick.json()["trace"]["profiles"]["default"]["scorers"]
    return next(s["scores"] for s in scorers if s["type"] == "prefill-eta-scorer")


def test_the_first_streamed_token_releases_the_prefill_backlog(client, sim):
    """The gateway tells the profile actors when a stream's first token arrives: while the stream
    is still running, its pod no longer counts the prompt as work ahead of the next request."""
    wait_until(lambda: set(backlog_scores(client).values()) == {1.0})  # earlier tests' work has drained
    body = {"model": MODEL, "stream": True, "max_tokens": 600, "prompt": "p" * 8000}
    with client.stream("POST", "/v1/completions", json=body) as resp:
        lines = resp.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))  # the first token is here
        # Events ride to the profile actor asynchronously (a later batch may land first): poll briefly.
        wait_until(lambda: set(backlog_scores(client).values()) == {1.0}, timeout_s=1.5, every_s=0.05)
        assert sum(p.snapshot()["running_requests_size"] for p in sim.pods) >= 1  # still decoding: not completed
        for _ in lines:
            pass


def test_loaded_pod_is_avoided(client, sim):
    busy = sim.pods[0]
    with httpx.Client(timeout=120) as direct:
        # Fill pod 0's 4 slots and queue more behind them: long decodes.
        import threading

        def hammer():
            direct.post(f"{busy.url}/v1/completions", json={"model": MODEL, "prompt": "load", "max_tokens": 400})

        threads = [threading.Thread(target=hammer, daemon=True) for _ in range(12)]
        for t in threads:
            t.start()
        wait_until(lambda: busy.snapshot()["waiting_queue_size"] >= 5, timeout_s=10)
        time.sleep(0.3)  # a few scrapes
        picks = [
            destination(client.post("/v1/completions", json={"model": MODEL, "prompt": f"n{i}", "max_tokens": 1}), sim)
            for i in range(8)
        ]
        assert busy.name not in picks
        for t in threads:
            t.join()


def test_sheddable_is_shed_when_saturated_and_critical_is_served(client, sim):
    import threading

    with httpx.Client(timeout=120) as direct:

        def hammer(url):
            direct.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": "load", "max_tokens": 300})

        threads = [threading.Thread(target=hammer, args=(p.url,), daemon=True) for p in sim.pods for _ in range(10)]
        for t in threads:
            t.start()
        wait_until(lambda: all(p.snapshot()["waiting_queue_size"] >= 5 for p in sim.pods), timeout_s=10)
        time.sleep(0.3)
        shed = client.post(
            "/v1/completions",
            json={"model": MODEL, "prompt": "x", "max_tokens": 1},
            headers={"x-gateway-inference-objective": "batch"},
        )
        assert shed.status_code == 429
        assert shed.json()["error"]["code"] == "ResourceExhausted"
        critical = client.post(
            "/v1/completions",
            json={"model": MODEL, "prompt": "x", "max_tokens": 1},
            headers={"x-gateway-inference-objective": "chat"},
        )
        assert critical.status_code == 200
        for t in threads:
            t.join()


def test_503_before_first_byte_is_retried_elsewhere(client, sim):
    bad = sim.pods[1]
    bad.set_failures({"rate": 1.0, "types": ["503"]})
    try:
        for i in range(6):
            resp = client.post("/v1/completions", json={"model": MODEL, "prompt": f"r{i}", "max_tokens": 1})
            assert resp.status_code == 200
            assert destination(resp, sim) != bad.name
    finally:
        bad.set_failures({"rate": 0.0})


@pytest.mark.spends_e2e_setup  # a restarted profile actor's event counts start again: the
# deployment's other modules (their in-flight checks) run before it
def test_a_killed_profile_actor_is_restarted_and_requests_keep_working(client, gateway):
    import ray

    ray.kill(gateway.actors.profiles["default"], no_restart=False)
    body = {"model": MODEL, "prompt": "after restart", "max_tokens": 1}
    wait_until(lambda: client.post("/v1/completions", json=body).status_code == 200, timeout_s=60, every_s=0.5)
    answers = [client.post("/v1/completions", json=body) for _ in range(5)]
    assert [a.status_code for a in answers] == [200] * 5, [a.text for a in answers if a.status_code != 200]


@pytest.mark.spends_e2e_setup  # a restarted profile actor's event counts start again: the
# deployment's other modules (their in-flight checks) run before it
def test_a_frozen_profile_actor_costs_a_503_naming_it_not_a_hang(client, gateway):
    """A profile actor that is alive but answers nothing (SIGSTOP: a stuck or swapping process)
    fails the requests waiting on it after `profile_call_timeout_s`, the later ones too (they
    queued behind the first batch before the bound); once it runs again, so do requests."""
    import os
    import signal
    from concurrent.futures import ThreadPoolExecutor

    import ray

    actor = gateway.actors.profiles["default"]
    pid = ray.get(actor.__ray_call__.remote(lambda _self: os.getpid()), timeout=30)
    body = {"model": MODEL, "prompt": "while frozen", "max_tokens": 1}
    os.kill(pid, signal.SIGSTOP)
    try:
        patient = httpx.Client(base_url=client.base_url, timeout=6 * PROFILE_CALL_TIMEOUT_S)
        with patient as c, ThreadPoolExecutor(4) as ex:
            answers = list(ex.map(lambda _: c.post("/v1/completions", json=body), range(4)))
    finally:
        os.kill(pid, signal.SIGCONT)
    assert [a.status_code for a in answers] == [503] * 4, [a.text for a in answers]
    assert all("profile actor 'default' unavailable" in a.json()["error"]["message"] for a in answers)
    assert any("no answer within" in a.json()["error"]["message"] for a in answers), answers[0].text
    wait_until(lambda: client.post("/v1/completions", json=body).status_code == 200, timeout_s=60, every_s=0.5)


def test_stale_metrics_take_a_pod_out_and_back(client, sim):
    flaky = sim.pods[2]
    flaky.set_failures({"metrics_garbage_rate": 1.0})
    try:
        wait_until(lambda: client.get("/ready").json()["ready_endpoints"] == 2, timeout_s=15)
        picks = {
            destination(client.post("/v1/completions", json={"model": MODEL, "prompt": f"s{i}", "max_tokens": 1}), sim)
            for i in range(10)
        }
        assert flaky.name not in picks
    finally:
        flaky.set_failures({"metrics_garbage_rate": 0.0})
    wait_until(lambda: client.get("/ready").json()["ready_endpoints"] == 3, timeout_s=15)


@pytest.mark.spends_e2e_setup(2)  # every pod: after the tests that spend less
def test_zz_no_ready_pod_is_503(client, sim):
    """Runs last: stops every pod."""
    for p in sim.pods:
        p.stop()
    wait_until(lambda: client.get("/ready").status_code == 503, timeout_s=20)
    resp = client.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 1})
    assert resp.status_code == 503
    assert resp.json()["error"]["type"] == "service_unavailable"
