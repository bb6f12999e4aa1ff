"""SLO headers and the latency predictor through a real gateway (simulated pods on 127.0.0.1):
the headers reach the profile actor's plugins, and the predictor learns from the real responses'
first tokens. Seen from outside: `latency-slo-admitter` never refuses while the predictor is cold,
and refuses an impossible SLO once it has learned (its message names the SLO)."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.conftest import GATEWAY_TEST_PORT

pytestmark = pytest.mark.ray

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
CONFIG = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: predicted-latency-producer
  parameters: {minSamples: 4}
- type: latency-slo-admitter
  parameters: {admitIdleOrCold: false}  # the quiet test pods would always admit
- type: slo-headroom-tier-filter
- type: latency-scorer
- type: queue-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: latency-slo-admitter
  - pluginRef: slo-headroom-tier-filter
  - pluginRef: latency-scorer
  - pluginRef: queue-scorer
"""
IMPOSSIBLE = {"x-slo-ttft-ms": "0.001", "x-gateway-inference-objective": "batch"}


@pytest.fixture(scope="module")
def client(ray_session, tmp_path_factory):
    from actors.launcher import PodSpec
    from ray_epp.simulator import make_pod_configs, start_sim_pods_in_thread
    from serve_app.cli.launch import EppDeployment, LaunchSpec

    cluster = start_sim_pods_in_thread(make_pod_configs(2), time_scale=10.0, seed=7)
    path = tmp_path_factory.mktemp("slo-e2e") / "config.yaml"
    path.write_text(CONFIG)
    pods = [PodSpec(name=p.name, address="127.0.0.1", port=p.port, labels=p.labels) for p in cluster.pods]
    dep = EppDeployment.start(
        LaunchSpec(
            config_path=str(path), pods=pods, settings={"objectives": {"batch": -1, "chat": 1}}, port=GATEWAY_TEST_PORT
        )
    )
    with httpx.Client(base_url=dep.url, timeout=60) as c:
        yield c
    dep.stop()
    cluster.stop()


def streamed(client, headers: dict[str, str]) -> int:
    body = {"model": MODEL, "prompt": "tell me a story " * 20, "max_tokens": 4, "stream": True}
    with client.stream("POST", "/v1/completions", json=body, headers=headers) as s:
        for _ in s.iter_lines():
            pass
        return s.status_code


def test_a_malformed_slo_header_is_a_400_naming_it(client):
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": "p"}, headers={"x-slo-ttft-ms": "asap"})
    assert r.status_code == 400
    assert "x-slo-ttft-ms" in r.json()["error"]["message"]


def test_the_predictor_learns_from_real_responses_and_the_admitter_then_refuses(client):
    assert streamed(client, IMPOSSIBLE) == 200  # cold: nothing predicted, nothing refused
    for _ in range(4):
        assert streamed(client, {}) == 200  # first tokens the predictor learns from
    # The events reach the profile actor in its next batch, a moment after the responses.
    deadline = time.monotonic() + 10.0
    while (status := streamed(client, IMPOSSIBLE)) == 200 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert status == 429
    r = client.post("/v1/completions", json={"model": MODEL, "prompt": "p", "max_tokens": 2}, headers=IMPOSSIBLE)
    assert r.status_code == 429
    assert "x-slo-ttft-ms=0.001" in r.json()["error"]["message"]
    # A request that is not sheddable is served (onlySheddable), and one with a reachable SLO too.
    assert streamed(client, {"x-slo-ttft-ms": "0.001", "x-gateway-inference-objective": "chat"}) == 200
    assert streamed(client, {"x-slo-ttft-ms": "60000", "x-gateway-inference-objective": "batch"}) == 200
