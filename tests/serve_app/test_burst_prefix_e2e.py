"""`burst-prefix-cache-producer` through a real gateway: the batch window runs in the gateway
replica (a DataPreparer), the assignment travels in the cycle state to the profile actor, and
the samples of one prompt sent together land on one pod while two groups land on two."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.serve_app.deployments import start_deployment

pytestmark = pytest.mark.ray

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
# No token-producer: prompts are hashed from their text. Without the burst affinity, equal idle
# pods leave every pick to max-score-picker's random tie-break.
CONFIG = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: burst-prefix-cache-producer
  parameters: {windowDurationMs: 300}
- type: prefix-cache-scorer
  parameters: {prefixMatchInfoProducerName: burst-prefix-cache-producer}
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-scorer
  - pluginRef: max-score-picker
"""
PROMPT = "a rollout prompt every sample of the group shares, long enough for a few blocks. " * 12


@pytest.fixture(scope="module")
def sim():
    from ray_epp.simulator import make_pod_configs, start_sim_pods_in_thread

    cluster = start_sim_pods_in_thread(make_pod_configs(3), time_scale=1.0, seed=3)
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def gateway(ray_session, sim):
    dep = start_deployment(sim, CONFIG)
    yield dep
    dep.stop()


def test_a_burst_of_samples_lands_on_one_pod_and_two_groups_on_two(gateway, sim):
    def send(prompt: str) -> str:
        with httpx.Client(base_url=gateway.url, timeout=30) as c:
            r = c.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 2})
        assert r.status_code == 200, r.text
        host_port = r.headers["x-gateway-destination-endpoint"]
        return next(p.name for p in sim.pods if host_port.endswith(f":{p.port}"))

    with ThreadPoolExecutor(8) as pool:
        pods = list(pool.map(send, [PROMPT + "A"] * 4 + [PROMPT + "B"] * 4))
    assert len(set(pods[:4])) == 1 and len(set(pods[4:])) == 1, pods
    assert pods[0] != pods[4], pods  # the second group goes to a replica the window left idle
