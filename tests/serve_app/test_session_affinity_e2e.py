"""Session affinity through a real gateway (llm-d's default algorithm): every response carries
`x-session-token`, a client that echoes it stays on its pod, and a stale token (its pod gone)
falls back to normal scoring."""

from __future__ import annotations

import base64

import httpx
import pytest

from tests.serve_app.deployments import start_deployment

pytestmark = pytest.mark.ray

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
# Without the scorer, equal queues leave the pick to max-score-picker's random tie-break.
CONFIG = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: session-affinity-scorer
- type: queue-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: session-affinity-scorer
    weight: 10
  - pluginRef: queue-scorer
    weight: 1
  - pluginRef: max-score-picker
"""


@pytest.fixture(scope="module")
def sim():
    from ray_epp.simulator import make_pod_configs, start_sim_pods_in_thread

    cluster = start_sim_pods_in_thread(make_pod_configs(3, max_num_seqs=8), time_scale=1.0, seed=11)
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def gateway(ray_session, sim):
    dep = start_deployment(sim, CONFIG)
    yield dep
    dep.stop()


def completion(client: httpx.Client, headers: dict[str, str] | None = None, stream: bool = False) -> httpx.Response:
    body = {"model": MODEL, "prompt": "Tell me a story", "max_tokens": 2, "stream": stream}
    return client.post("/v1/completions", json=body, headers=headers or {})


def pod_of(resp: httpx.Response, sim) -> str:
    host_port = resp.headers["x-gateway-destination-endpoint"]
    return next(p.name for p in sim.pods if host_port.endswith(f":{p.port}"))


def token_pod(resp: httpx.Response) -> str:
    return base64.b64decode(resp.headers["x-session-token"], validate=True).decode()


def test_the_token_names_the_pod_and_an_echoing_client_stays_there(client, sim):
    first = completion(client)
    assert first.status_code == 200, first.text
    pod = pod_of(first, sim)
    assert token_pod(first) == pod
    token = {"x-session-token": first.headers["x-session-token"]}
    followers = [completion(client, token) for _ in range(8)]
    assert [r.status_code for r in followers] == [200] * 8
    assert {pod_of(r, sim) for r in followers} == {pod}
    assert {token_pod(r) for r in followers} == {pod}


def test_a_stream_carries_the_token_too(client, sim):
    with client.stream(
        "POST", "/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 2, "stream": True}
    ) as resp:
        assert resp.status_code == 200
        assert token_pod(resp) == pod_of(resp, sim)
        assert b"[DONE]" in resp.read()


def test_a_stale_token_falls_back_to_normal_scoring(client, sim):
    stale = {"x-session-token": base64.b64encode(b"pod-that-left").decode()}
    resp = completion(client, stale)
    assert resp.status_code == 200, resp.text
    assert token_pod(resp) == pod_of(resp, sim)  # a fresh token for where it went
    garbage = completion(client, {"x-session-token": "not base64 at all!"})
    assert garbage.status_code == 200
