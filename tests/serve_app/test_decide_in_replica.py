"""`decide_in_replica`: the gateway replica runs the profiles itself on its view of the pool
(serve_app/gateway/local_runner.py). Real Ray EPP with the shipped default config in front of
simulated vLLM pods: requests are routed and served, a shared prefix stays on its pod, a burst of
new prompts spreads (each decision counts in the ledgers at once), no profile actor is started
(an earlier launch's is ended), and a configuration that needs the profile actors is refused at
launch."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.serve_app.deployments import sim_pods, start_deployment

pytestmark = pytest.mark.ray

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sim():
    yield from sim_pods(3, seed=23)


# Its own deployment: deciding in the replica is another request path than every shared setup's.
@pytest.fixture(scope="module")
def gateway(ray_session, sim):
    dep = start_deployment(sim, settings={"decide_in_replica": True})
    yield dep
    dep.stop()


def complete(client: httpx.Client, prompt: str, max_tokens: int = 2) -> str:
    resp = client.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": max_tokens})
    assert resp.status_code == 200, resp.text
    return resp.headers["x-gateway-destination-endpoint"]


def test_a_shared_prefix_stays_on_its_pod(client):
    system = "You are a careful assistant who answers in one short sentence. " * 40
    picks = {complete(client, system + f"question {i}?") for i in range(8)}
    assert len(picks) == 1, picks


def test_a_burst_of_new_prompts_spreads_over_the_pods(client):
    """Twelve different long prompts at once: each decision sees the ones made before it (the
    in-flight and prefill ledgers learn a decision when it is made, before its PreRequest)."""
    prompts = [f"topic {i}: " + f"an unrelated long document number {i} " * 60 for i in range(12)]
    with ThreadPoolExecutor(12) as pool:
        picks = list(pool.map(lambda p: complete(client, p, max_tokens=30), prompts))
    assert len(set(picks)) >= 2, picks


def test_no_profile_actor_is_started(gateway, client):
    """The replica decides, so no profile actor would ever be called: none runs, no standby."""
    import ray

    from actors.launcher import profile_actor_name
    from actors.standby import standby_name

    complete(client, "one more request")
    assert gateway.actors.profiles == {} and gateway.actors.all_profile_actors() == []
    name = profile_actor_name(gateway.actors.datastore_name, "default")
    for actor_name in (name, standby_name(name)):
        with pytest.raises(ValueError):
            ray.get_actor(actor_name, namespace=gateway.actors.namespace)


def test_an_earlier_launchs_profile_actors_are_ended(gateway, sim):
    """Profile actors an earlier launch with the actors deciding left on this datastore (detached
    ones outlive it) would sit idle: a launch that decides in the replica ends them."""
    import ray

    from actors.launcher import profile_actor_name, start_epp_actors
    from scheduler.config import DecideIn
    from tests.serve_app.deployments import pod_specs

    options = {"datastore_name": gateway.actors.datastore_name}
    earlier = start_epp_actors(gateway.actors.config, pod_specs(sim), options=options)
    assert list(earlier.profiles) == ["default"]
    try:
        now = start_epp_actors(gateway.actors.config, pod_specs(sim), options=options, decide_in=DecideIn.REPLICA)
        assert now.profiles == {}
        with pytest.raises(ValueError):
            ray.get_actor(profile_actor_name(now.datastore_name, "default"), namespace=now.namespace)
    finally:
        ray.kill(earlier.profiles["default"], no_restart=True)


def test_the_replicas_own_plugins_export_their_families(client):
    complete(client, "a prompt the prefix indexer learns " * 10)
    names = {fam.name for fam in text_string_to_metric_families(client.get("/metrics").text)}
    assert "llm_d_epp_prefix_indexer_size" in names


def test_a_config_that_needs_the_profile_actors_is_refused_at_launch(sim):
    from serve_app.cli.launch import LaunchError

    with pytest.raises(LaunchError, match=r"decide_in_replica: .*KV events"):
        start_deployment(sim, str(ROOT / "bench" / "configs" / "precise.yaml"), settings={"decide_in_replica": True})
    with pytest.raises(LaunchError, match="decide_in_replica: profile_shards is 2"):
        start_deployment(sim, settings={"decide_in_replica": True}, actor_options={"profile_shards": 2})
