"""Admission with a ledger detector, end to end: the gateway replica feeds its own
`prefill-backlog-detector` and sheds sheddable requests while prompt work is queued, on simulated
pods slowed so a prefill takes a while."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import GATEWAY_TEST_PORT

pytestmark = pytest.mark.ray

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
CONFIG = """
plugins:
- type: queue-scorer
- type: prefill-backlog-scorer
- type: prefill-backlog-detector
  parameters: {maxBacklogTokens: 200}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: queue-scorer}, {pluginRef: prefill-backlog-scorer}]
"""


@pytest.fixture(scope="module")
def sim():
    from ray_epp.simulator import make_pod_configs, start_sim_pods_in_thread

    # x40 slower: a 2,000-token prefill takes ~2.5 s of wall time.
    cluster = start_sim_pods_in_thread(make_pod_configs(2), time_scale=40.0, seed=5)
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def client(ray_session, sim, tmp_path_factory):
    from actors.launcher import PodSpec
    from serve_app.cli.launch import EppDeployment, LaunchSpec

    path = tmp_path_factory.mktemp("admission") / "config.yaml"
    path.write_text(CONFIG)
    pods = [PodSpec(name=p.name, address="127.0.0.1", port=p.port, labels=p.labels) for p in sim.pods]
    dep = EppDeployment.start(
        LaunchSpec(
            config_path=str(path), pods=pods, settings={"objectives": {"batch": -1, "chat": 1}}, port=GATEWAY_TEST_PORT
        )
    )
    with httpx.Client(base_url=dep.url, timeout=120) as c:
        yield c
    dep.stop()


def ask(client, objective: str, prompt: str = "short", **extra) -> httpx.Response:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 2, **extra}
    return client.post("/v1/completions", json=body, headers={"x-gateway-inference-objective": objective})


def test_sheddable_waits_out_queued_prompt_work_and_critical_does_not(client):
    assert ask(client, "batch").status_code == 200  # nothing queued: admitted
    body = {"model": MODEL, "prompt": "long " * 1600, "max_tokens": 50, "stream": True}
    with client.stream(
        "POST", "/v1/completions", json=body, headers={"x-gateway-inference-objective": "chat"}
    ) as stream:
        assert stream.status_code == 200
        # ~2,000 prompt tokens queued over 2 pods: 1,000 each on average, over the 200 line.
        shed = ask(client, "batch")
        assert shed.status_code == 429, shed.text
        assert shed.json()["error"]["code"] == "ResourceExhausted" or "saturated" in shed.text
        assert ask(client, "chat").status_code == 200  # critical traffic is not shed
        lines = stream.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))  # its first token
        assert ask(client, "batch").status_code == 200  # the prompt work is done: admitted again
        for _ in lines:
            pass
