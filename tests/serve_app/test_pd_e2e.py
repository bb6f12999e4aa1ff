"""P/D end to end: a real Serve gateway, ray_epp/configs/pd.yaml, simulated prefill and decode pods."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.serve_app.deployments import PD_DEBUG

pytestmark = pytest.mark.ray

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
LONG = "The quick brown fox studies distributed systems and writes long essays about them. " * 40


def fresh(tag: str) -> str:
    """A long prompt no pod has seen: its first block differs."""
    return f"[{tag}] " + LONG


# extproc/test_extproc_pd.py runs against the same setup, before this module: it stops pods.
E2E_SETUP = PD_DEBUG
E2E_SETUP_SPENT = True


def ask(client, prompt: str, **extra) -> tuple[httpx.Response, dict]:
    resp = client.post(
        "/v1/completions",
        json={"model": MODEL, "prompt": prompt, "max_tokens": 4, **extra},
        headers={"x-epp-debug": "1"},
    )
    return resp, json.loads(resp.headers.get("x-epp-trace", "{}"))


def pod_of(resp, sim) -> str:
    hp = resp.headers["x-gateway-destination-endpoint"]
    return next(p.name for p in sim.pods if hp.endswith(f":{p.port}"))


def metric(client, name: str, label: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(name) and label in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_long_uncached_prompt_goes_pd_and_carries_prefill_params(client, sim):
    resp, trace = ask(client, fresh("first"))
    assert resp.status_code == 200, resp.text
    assert pod_of(resp, sim).startswith("decode-")
    pd = trace["trace"]["pd"]
    assert pd["decision"] == "pd"
    assert pd["prefill"].startswith("prefill-")
    prefill_pod = next(p for p in sim.pods if p.name == pd["prefill"])
    # The decoder got the params the prefill pod returned: they name that pod...
    assert pd["kv_transfer_params"]["remote_port"] == prefill_pod.port
    # ...and it pulled the prompt's KV instead of computing it.
    usage = resp.json()["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] >= usage["prompt_tokens"] - 16
    assert trace["profiles"]["prefill"] == [pd["prefill"]]


def test_cached_or_short_prompts_are_decode_only(client, sim):
    ask(client, fresh("second"))
    time.sleep(0.1)
    resp, trace = ask(client, fresh("second"))  # the decode pod holds this prefix now
    assert resp.status_code == 200
    assert trace["trace"]["pd"]["decision"] == "decode-only"
    short, trace = ask(client, "hi")
    assert short.status_code == 200
    assert trace["trace"]["pd"]["decision"] == "decode-only"
    assert pod_of(short, sim).startswith("decode-")


def test_client_cannot_inject_the_prefiller_header(client, sim):
    resp = client.post(
        "/v1/completions",
        json={"model": MODEL, "prompt": fresh("inject"), "max_tokens": 2},
        headers={"x-epp-debug": "1", "x-prefiller-host-port": "10.9.9.9:1"},
    )
    assert resp.status_code == 200
    pd = json.loads(resp.headers["x-epp-trace"])["trace"]["pd"]
    assert pd["prefill"] in {p.name for p in sim.pods}


def test_prefill_failure_falls_back_to_decode_only_and_is_counted(client, sim):
    before = metric(client, "ray_epp_pd_handoffs_total", 'outcome="pd-fallback"')
    for p in sim.pods[:2]:
        p.set_failures({"rate": 1.0, "types": ["500"]})
    try:
        resp, trace = ask(client, fresh("fallback"))
        assert resp.status_code == 200
        assert trace["trace"]["pd"]["decision"] == "pd-fallback"
        assert pod_of(resp, sim).startswith("decode-")
    finally:
        for p in sim.pods[:2]:
            p.set_failures({"rate": 0.0})
    assert metric(client, "ray_epp_pd_handoffs_total", 'outcome="pd-fallback"') == before + 1
    assert metric(client, "ray_epp_pd_handoffs_total", 'outcome="pd"') >= 1
    # llm-d's count of the handler's decisions: the prefill stage was chosen for both
    decided = 'decision_type="prefill-decode"'
    assert metric(client, "llm_d_epp_disagg_decision_total", decided) >= 2


def test_prefill_pods_killed_during_the_prefill_serve_decode_only(client, sim):
    """The prefill pods stop (server and engine) while the prefill step runs on one of them (a
    ~1.3 s prefill of ~4,000 tokens): the request is served decode-only, not failed."""
    import threading

    answer: dict = {}

    def send() -> None:
        answer["resp"], answer["trace"] = ask(client, fresh("mid") * 5)

    thread = threading.Thread(target=send)
    thread.start()
    deadline = time.monotonic() + 20

    def busy() -> bool:
        return any(p.snapshot()["running_requests_size"] + p.snapshot()["waiting_queue_size"] for p in sim.pods[:2])

    while not busy() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert busy(), "the prefill step reached a prefill pod"
    killed = time.monotonic()
    for p in sim.pods[:2]:
        p.stop()  # the prefill pods die: first a failed prefill call, then they leave the pool
    thread.join(30)
    resp, trace = answer["resp"], answer["trace"]
    assert resp.status_code == 200, resp.text
    pd = trace["trace"]["pd"]
    assert pd["decision"] == "pd-fallback" and pd["prefill_error"], pd
    assert pod_of(resp, sim).startswith("decode-")
    print(f"\nprefill pod killed mid-prefill: 200 decode-only {time.monotonic() - killed:.2f} s after the kill, "
          f"{pd['prefill_attempts']} prefill attempts: {pd['prefill_error'][:80]}")  # fmt: skip


def test_no_prefill_pod_serves_decode_only(client, sim):
    for p in sim.pods[:2]:
        p.stop()  # (stopped already by the test above)
    resp, trace = ask(client, fresh("no prefill"))
    assert resp.status_code == 200
    assert trace["trace"]["pd"]["decision"] in {"pd-fallback", "decode-only"}
    deadline = time.monotonic() + 15
    while client.get("/ready").json()["ready_endpoints"] != 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    resp, trace = ask(client, fresh("no prefill again"))
    assert resp.status_code == 200
    assert trace["trace"]["pd"]["decision"] == "decode-only"
    assert trace["profiles"].get("prefill") is None


def test_no_decode_pod_is_an_error(client, sim):
    for p in sim.pods[2:]:
        p.stop()
    deadline = time.monotonic() + 15
    while client.get("/ready").status_code != 503 and time.monotonic() < deadline:
        time.sleep(0.2)
    resp, _ = ask(client, fresh("nowhere"))
    assert resp.status_code in (429, 503)
    assert resp.json()["error"]["message"]
