"""Flow control through a real gateway (Ray, Serve, the shared port) on simulated pods slowed x40:
a sheddable request waits in the queue while a prefill holds the pool saturated and is served
after; one that outwaits the TTL gets 429 `rejected-ttl-expired`, one past `maxRequests` 429
`rejected-saturated` at once; a client that disconnects leaves the queue before its TTL; with
`program-aware-fairness` the program that has been served less goes first although it queued
later, and the policy's llm-d gauges are on /metrics."""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

pytestmark = pytest.mark.ray

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
TTL_S = 2.5
CONFIG = f"""
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
featureGates: [flowControl]
plugins:
- type: queue-scorer
- type: prefill-backlog-detector
  parameters: {{maxBacklogTokens: 50}}
- type: program-aware-fairness
schedulingProfiles:
- name: default
  plugins: [{{pluginRef: queue-scorer}}]
flowControl:
  defaultRequestTTL: {TTL_S}s
  priorityBands:
  - priority: -1
    maxRequests: 1
    fairnessPolicyRef: program-aware-fairness
  - priority: -2
    maxRequests: 4
    fairnessPolicyRef: program-aware-fairness
"""
# program-aware-fairness (one tenant: it picks like any policy) puts the gateway's usage reading on
# every response of this module, streamed or not, and the answers must be as without it.
HEADERS = {"x-gateway-inference-objective": "batch", "x-gateway-inference-fairness-id": "tenant-a"}
QUEUED = 'inference_extension_flow_control_queue_size{{fairness_id="tenant-a",inference_pool="default",model_name="{m}",priority="-1",target_model_name="{m}"}}'  # noqa: E501
DURATION_COUNT = 'inference_extension_flow_control_request_queue_duration_seconds_count{{fairness_id="tenant-a",inference_pool="default",model_name="{m}",outcome="{o}",priority="-1",target_model_name="{m}"}}'  # noqa: E501


@pytest.fixture(scope="module")
def sim():
    from ray_epp.simulator import make_pod_configs, start_sim_pods_in_thread

    cluster = start_sim_pods_in_thread(make_pod_configs(2), time_scale=40.0, seed=5)
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def gateway(ray_session, sim):
    from tests.serve_app.deployments import start_deployment

    dep = start_deployment(sim, CONFIG, settings={"objectives": {"batch": -1, "bulk": -2, "chat": 1}})
    yield dep
    dep.stop()


def metric(client: httpx.Client, line: str) -> float:
    text = client.get("/metrics").text
    m = re.search(re.escape(line) + r" ([0-9.e+-]+)", text)
    return float(m.group(1)) if m else 0.0


def saturating_stream(client: httpx.Client, words: int, word: str = "long "):
    """A critical streamed request whose prompt holds the ledger over the line until its first token
    (a prompt the pods have not cached: a cached one would answer at once)."""
    body = {"model": MODEL, "prompt": word * words, "max_tokens": 3, "stream": True}
    return client.stream("POST", "/v1/completions", json=body, headers={"x-gateway-inference-objective": "chat"})


def sheddable(base_url: str, timeout: float = 60.0) -> httpx.Response:
    with httpx.Client(base_url=base_url, timeout=timeout) as c:
        return c.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2}, headers=HEADERS)


def wait_for(predicate, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_queued_then_served_ttl_and_capacity_answers_and_disconnect(client, gateway):
    queued = QUEUED.format(m=MODEL)

    def count(outcome: str) -> str:
        return DURATION_COUNT.format(m=MODEL, o=outcome)

    with ThreadPoolExecutor(4) as pool:
        # 1. queued, then served: ~1,000 prompt tokens (~1 s of prefill here) keep the pool saturated
        with saturating_stream(client, 800) as stream:
            assert stream.status_code == 200
            waiting = pool.submit(sheddable, gateway.url)
            assert wait_for(lambda: metric(client, queued) == 1.0), "the sheddable request was not queued"
            for _ in stream.iter_lines():
                pass
        served = waiting.result(timeout=30)
        assert served.status_code == 200, served.text
        assert metric(client, count("Dispatched")) >= 1.0
        assert metric(client, queued) == 0.0

        # 2. TTL and capacity: ~5,000 prompt tokens take longer than the TTL to prefill
        with saturating_stream(client, 4000) as stream:
            assert stream.status_code == 200
            waiting = pool.submit(sheddable, gateway.url)
            assert wait_for(lambda: metric(client, queued) == 1.0)
            full = sheddable(gateway.url)  # the band holds at most one
            assert full.status_code == 429, full.text
            assert full.headers["x-llm-d-request-dropped-reason"] == "rejected-saturated"
            assert full.json()["error"]["code"] == "ResourceExhausted"
            expired = waiting.result(timeout=30)
            assert expired.status_code == 429, expired.text
            assert expired.headers["x-llm-d-request-dropped-reason"] == "rejected-ttl-expired"
            assert "timed out in queue" in expired.json()["error"]["message"]
            for _ in stream.iter_lines():
                pass

        # 3. a client that disconnects leaves the queue at once, not at its TTL
        with saturating_stream(client, 4000, "other ") as stream:
            assert stream.status_code == 200
            before = metric(client, count("EvictedContextCancelled"))
            gone = pool.submit(sheddable, gateway.url, 1.0)
            assert wait_for(lambda: metric(client, queued) == 1.0)
            with pytest.raises(httpx.ReadTimeout):
                gone.result(timeout=30)
            assert wait_for(lambda: metric(client, count("EvictedContextCancelled")) == before + 1, 1.0)
            assert metric(client, queued) == 0.0
            # it left within the TTL (2.5 s): counted at or below that bucket; its outcome says why it left
            le = 'inference_extension_flow_control_request_queue_duration_seconds_bucket{{fairness_id="tenant-a",inference_pool="default",le="2.5",model_name="{m}",outcome="EvictedContextCancelled",priority="-1",target_model_name="{m}"}}'  # noqa: E501
            assert metric(client, le.format(m=MODEL)) == before + 1
            for _ in stream.iter_lines():
                pass


def test_program_aware_fairness_serves_the_less_served_program_first_and_exports_its_gauges(client, gateway):
    def bulk(program: str, words: int, word: str) -> int:
        """A sheddable request of `program` whose prompt (uncached) holds the ledger over the line
        until its first token."""
        headers = {"x-gateway-inference-objective": "bulk", "x-gateway-inference-fairness-id": program}
        body = {"model": MODEL, "prompt": f"{word} " * words, "max_tokens": 2}
        with httpx.Client(base_url=gateway.url, timeout=60) as c:
            return c.post("/v1/completions", json=body, headers=headers).status_code

    def queued(program: str) -> float:
        return metric(client, QUEUED.format(m=MODEL).replace("tenant-a", program).replace('"-1"', '"-2"'))

    def gauge(name: str, program: str | None = None) -> float:
        label = f'{{program_id="{program}"}}' if program else ""
        return metric(client, f"llm_d_epp_program_aware_{name}{label}")

    # tenant-x is served first, alone on an idle pool: it attains service, tenant-y has none
    assert bulk("tenant-x", 60, "warm") == 200
    assert wait_for(lambda: gauge("attained_service_tokens", "tenant-x") > 0), "usage not learnt"
    with ThreadPoolExecutor(3) as pool:
        with saturating_stream(client, 800, "hold") as stream:
            assert stream.status_code == 200
            x1 = pool.submit(bulk, "tenant-x", 800, "xray")
            assert wait_for(lambda: queued("tenant-x") == 1.0)
            x2 = pool.submit(bulk, "tenant-x", 800, "xylo")
            assert wait_for(lambda: queued("tenant-x") == 2.0)
            y1 = pool.submit(bulk, "tenant-y", 800, "yank")  # queued last
            assert wait_for(lambda: queued("tenant-y") == 1.0)
            lines = stream.iter_lines()
            next(lines)  # its first token: the pool frees now (the stream decodes on)
            # The first dispatch pass sends two (the window: one per pod), then their prefills
            # (~1,000 tokens each, ~1 s here) hold the pool. Least attained service goes first, so
            # y1 and x1 leave and x2 waits; first-come order (or x's older heads) would have sent
            # x1 and x2.
            assert wait_for(lambda: queued("tenant-x") + queued("tenant-y") < 3.0)
            assert (queued("tenant-x"), queued("tenant-y")) == (1.0, 0.0)
            assert not wait_for(lambda: queued("tenant-x") < 1.0, 0.3), "a third dispatch in the same pass"
            for _ in lines:
                pass
        assert y1.result(timeout=30) == 200 and x1.result(timeout=30) == 200
        assert x2.result(timeout=30) in (200, 429)  # it may outwait the TTL behind two prefills
    assert wait_for(lambda: gauge("attained_service_tokens", "tenant-y") > 0)
    wait_x, wait_y = gauge("avg_wait_time_milliseconds", "tenant-x"), gauge("avg_wait_time_milliseconds", "tenant-y")
    assert wait_x > 0 and wait_y > 0
    # Jain's index over every program's mean wait (tenant-a's from the test above, when it ran)
    waits = [w for w in (wait_x, wait_y, gauge("avg_wait_time_milliseconds", "tenant-a")) if w > 0]
    assert gauge("jains_fairness_index") == pytest.approx(
        sum(waits) ** 2 / (len(waits) * sum(w * w for w in waits)), rel=1e-6
    )
