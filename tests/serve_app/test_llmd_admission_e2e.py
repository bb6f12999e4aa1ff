"""llm-d's admission wiring through a real gateway: `flowControl.saturationDetector` names a
`concurrency-detector`, which the gateway replica feeds with its own requests in flight, and only
that detector decides (the default utilization detector, which the idle simulated pods never trip,
is not asked either way)."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.conftest import GATEWAY_TEST_PORT

pytestmark = pytest.mark.ray

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
CONFIG = """
apiVersion: llm-d.ai/v1
kind: EndpointPickerConfig
featureGates: [haPopulateNonLeaderDatastore]
plugins:
- type: queue-scorer
- type: concurrency-detector
  parameters: {maxConcurrency: 1}
flowControl:
  saturationDetector: {pluginRef: concurrency-detector}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: queue-scorer}]
"""


@pytest.fixture(scope="module")
def client(ray_session, tmp_path_factory):
    from actors.launcher import PodSpec
    from ray_epp.simulator import make_pod_configs, start_sim_pods_in_thread
    from serve_app.cli.launch import EppDeployment, LaunchSpec

    cluster = start_sim_pods_in_thread(make_pod_configs(1), time_scale=40.0, seed=5)
    path = tmp_path_factory.mktemp("llmd-admission") / "config.yaml"
    path.write_text(CONFIG)
    pods = [PodSpec(name=p.name, address="127.0.0.1", port=p.port, labels=p.labels) for p in cluster.pods]
    dep = EppDeployment.start(
        LaunchSpec(
            config_path=str(path), pods=pods, settings={"objectives": {"batch": -1, "chat": 1}}, port=GATEWAY_TEST_PORT
        )
    )
    with httpx.Client(base_url=dep.url, timeout=120) as c:
        yield c
    dep.stop()
    cluster.stop()


def ask(client, objective: str) -> httpx.Response:
    body = {"model": MODEL, "prompt": "short", "max_tokens": 2}
    return client.post("/v1/completions", json=body, headers={"x-gateway-inference-objective": objective})


def test_the_named_concurrency_detector_sheds_while_a_request_is_in_flight(client):
    assert ask(client, "batch").status_code == 200  # nothing in flight: admitted
    body = {"model": MODEL, "prompt": "long " * 1600, "max_tokens": 50, "stream": True}
    with client.stream("POST", "/v1/completions", json=body, headers={"x-gateway-inference-objective": "chat"}) as s:
        assert s.status_code == 200
        shed = ask(client, "batch")  # one request in flight on one pod of capacity 1: saturated
        assert shed.status_code == 429, shed.text
        assert ask(client, "chat").status_code == 200  # critical traffic is never shed
        for _ in s.iter_lines():
            pass
    # The response ended: admitted again once the gateway has run its end-of-response hook, which
    # follows the last chunk the client read by a moment.
    deadline = time.monotonic() + 10.0
    while (status := ask(client, "batch").status_code) == 429 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert status == 200
