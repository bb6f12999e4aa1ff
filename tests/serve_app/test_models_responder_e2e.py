"""`models-responder` through a real gateway, over HTTP, against simulated vLLM pods that serve
different LoRA adapters: GET /v1/models answers every pod's own list (adapters with their parent),
a request for an adapter goes only to the pods that list it, one loaded at run time is listed and
routed to once the pod's list is collected again, and base-model requests still spread."""

from __future__ import annotations

import httpx
import pytest

from tests.actors.support import wait_for
from tests.conftest import GATEWAY_TEST_PORT
from tests.serve_app.deployments import start_deployment

pytestmark = pytest.mark.ray

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
# No LoRA scorer: without the screen, equal queues leave the pick to the picker's random tie-break.
CONFIG = """
apiVersion: llm-d.ai/v1
kind: EndpointPickerConfig
plugins:
- type: models-responder
- type: queue-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
  - pluginRef: max-score-picker
"""
ADAPTERS = {"sim-0": ["sql-lora"], "sim-1": ["chat-lora"], "sim-2": []}


@pytest.fixture(scope="module")
def sim():
    from ray_epp.simulator import PodConfig, start_sim_pods_in_thread

    pods = [PodConfig(name=name, lora_adapters=loras, max_num_seqs=8) for name, loras in ADAPTERS.items()]
    cluster = start_sim_pods_in_thread(pods, time_scale=1.0, seed=5)
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def gateway(ray_session, sim):
    dep = start_deployment(sim, CONFIG, proxy_port=GATEWAY_TEST_PORT + 1, actor_options={"models_refresh_s": 0.3})
    yield dep
    dep.stop()


def listed(client: httpx.Client) -> dict[str, dict]:
    resp = client.get("/v1/models")
    return {m["id"]: m for m in resp.json()["data"]} if resp.status_code == 200 else {}


def destinations(client: httpx.Client, sim, model: str, n: int) -> set[str]:
    out = set()
    for i in range(n):
        body = {"model": model, "prompt": f"request {i}", "max_tokens": 2}
        resp = client.post("/v1/completions", json=body)
        assert resp.status_code == 200, resp.text
        host_port = resp.headers["x-gateway-destination-endpoint"]
        out.add(next(p.name for p in sim.pods if host_port.endswith(f":{p.port}")))
    return out


def test_v1_models_is_the_union_of_every_pods_list(client):
    models = wait_for(lambda: (m := listed(client)) and {"sql-lora", "chat-lora"} <= m.keys() and m, 20.0)
    assert sorted(models) == sorted([MODEL, "chat-lora", "sql-lora"])
    assert models["sql-lora"]["parent"] == MODEL and models["chat-lora"]["parent"] == MODEL
    assert "parent" not in models[MODEL]
    assert all(m["object"] == "model" and m["owned_by"] == "vllm" and m["created"] > 0 for m in models.values())
    assert client.get("/v1/models/").status_code in (200, 307)  # a trailing slash is the same route


def test_an_adapter_request_goes_only_to_the_pods_that_list_it(client, sim):
    wait_for(lambda: "sql-lora" in listed(client), 20.0)
    assert destinations(client, sim, "sql-lora", 12) == {"sim-0"}
    assert destinations(client, sim, "chat-lora", 12) == {"sim-1"}


def test_base_model_requests_still_spread(client, sim):
    assert len(destinations(client, sim, MODEL, 15)) >= 2


def test_an_adapter_loaded_at_run_time_is_listed_and_routed_to(client, sim):
    pod = next(p for p in sim.pods if p.name == "sim-2")
    loaded = httpx.post(
        f"http://127.0.0.1:{pod.port}/v1/load_lora_adapter", json={"lora_name": "new-lora", "lora_path": "/x"}
    )
    assert loaded.status_code == 200, loaded.text
    models = wait_for(lambda: (m := listed(client)) and "new-lora" in m and m, 20.0)
    assert models["new-lora"]["parent"] == MODEL
    assert destinations(client, sim, "new-lora", 10) == {"sim-2"}
