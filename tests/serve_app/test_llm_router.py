"""EPPRequestRouter in a real Serve: simulated LLM replicas (bench/serve_llm_replica.py) publishing
their engine state through record_routing_stats, called through handles from the driver and from
two ingress replicas (each with its own router, sharing the profile actors).

Each test must fail without the router: `EPP_LLM_ROUTER_CONTROL=1 pytest tests/serve_app/test_llm_router.py`
runs the module with Serve's default power-of-two router instead, and every test then fails
(docs/SERVE_LLM.md has the run). Where Serve's own routing would pass a test's main check (Serve's
multiplexing prefers a replica with the adapter loaded; it drops dead replicas), the test also
checks that EPP made the decisions."""

from __future__ import annotations

import os
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
import ray
from ray import serve
from ray.serve.config import RequestRouterConfig

from bench.serve_llm_replica import FakeLLMServer
from serve_app.llm_router.router import ROUTER_NAMESPACE, RouterConfigError, read_config, recent_decisions, router_stats
from tests.conftest import GATEWAY_TEST_PORT

APP = "llm-router-test"
CONFIG = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: lora-affinity-scorer
- type: active-request-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 1
  - pluginRef: prefix-cache-scorer
    weight: 4
  - pluginRef: lora-affinity-scorer
    weight: 25  # a resident adapter (1.0) over a free slot (0.8) outweighs every load difference
  - pluginRef: active-request-scorer
    weight: 1
"""
# Every replica carries a label no filter accepts: the scheduler never has an endpoint.
NO_ENDPOINT_CONFIG = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: label-selector-filter
  parameters:
    matchLabels:
      no-replica-has: this-label
- type: queue-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: label-selector-filter
  - pluginRef: queue-scorer
"""
# The config's data layer drives the router's scrapers: its extractor's vLLM mapping, which reads
# cache_config_info's block_size label as the block count (the preset reads num_gpu_blocks), and
# its source's interval.
DATA_LAYER_CONFIG = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: metrics-data-source
  parameters: {interval: 50ms}
- type: core-metrics-extractor
  parameters:
    engineConfigs:
    - name: vllm
      queuedRequestsSpec: vllm:num_requests_waiting
      runningRequestsSpec: vllm:num_requests_running
      kvUsageSpec: vllm:kv_cache_usage_perc
      cacheInfoSpec: vllm:cache_config_info
      cacheNumBlocksLabelName: block_size
- type: queue-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
dataLayer:
  sources:
  - pluginRef: metrics-data-source
    extractors:
    - pluginRef: core-metrics-extractor
"""
REPLICAS = 3
CONTROL = bool(os.environ.get("EPP_LLM_ROUTER_CONTROL"))  # Serve's default router: every test must fail
POW2 = "ray.serve._private.request_router.pow_2_router:PowerOfTwoChoicesRequestRouter"


def router_config(config: str, **kwargs) -> RequestRouterConfig:
    return RequestRouterConfig(
        request_router_class=POW2 if CONTROL else "serve_app.llm_router:EPPRequestRouter",
        request_router_kwargs={} if CONTROL else {"config": config, **kwargs},
        request_routing_stats_period_s=0.2,
        request_routing_stats_timeout_s=2.0,
    )


def llm_deployment(name: str, config: str, replicas: int = REPLICAS, **init):
    return serve.deployment(
        FakeLLMServer,
        name=name,
        num_replicas=replicas,
        max_ongoing_requests=8,
        ray_actor_options={"num_cpus": 0},
        request_router_config=router_config(config),
    ).bind(**init)


@serve.deployment(num_replicas=2, ray_actor_options={"num_cpus": 0}, max_ongoing_requests=32)
class Ingress:
    """A caller with its own handle (and so its own router) to the LLM deployment."""

    def __init__(self, llm) -> None:
        self.llm = llm
        self.me = serve.get_replica_context().replica_id.unique_id

    async def chat(self, body: dict) -> dict:
        out = await self.llm.chat.remote(body)
        return {**out, "ingress": self.me}

    async def stats(self) -> dict:
        return {"ingress": self.me, **router_stats()}


def chat(text: str, max_tokens: int = 4) -> dict:
    return {"model": "base", "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens}


def unique_prompt(n_chars: int = 600) -> str:
    return (uuid.uuid4().hex * (n_chars // 32 + 1))[:n_chars]


def profile_info(config: str) -> dict:
    from actors.launcher import router_profile_actor_name
    from actors.profile_actor import config_digest
    from scheduler import dump_config

    name = router_profile_actor_name(config_digest(dump_config(read_config(config))), "default")
    return ray.get(ray.get_actor(name, namespace=ROUTER_NAMESPACE).info.remote(), timeout=30)


def replica_ids(deployment: str) -> list[str]:
    """The unique ids of a deployment's live replicas, from their actor names."""
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]
    return [n.rsplit("#", 1)[1] for n in names if n.startswith(f"SERVE_REPLICA::{APP}#{deployment}#")]


def wait_for(check, timeout_s: float = 30.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def llm_app(ray_session):
    serve.start(http_options={"host": "127.0.0.1", "port": GATEWAY_TEST_PORT + 88})
    llm = llm_deployment("FakeLLM", CONFIG, overloaded_ranks=[0])
    handle = serve.run(Ingress.bind(llm), name=APP, route_prefix=f"/{APP}")
    llm_handle = serve.get_deployment_handle("FakeLLM", app_name=APP)
    ids = wait_for(lambda: len(r := replica_ids("FakeLLM")) == REPLICAS and r, 60, "the replicas")
    ranks: dict[str, int] = {}
    for _ in range(6):  # warm up: the router starts its profile actors
        info = llm_handle.whoami.remote().result(timeout_s=60)
        ranks[info["replica"]] = info["rank"]
    # The overloaded replica (rank 0) answers nothing while the router avoids it.
    unseen = [i for i in ids if i not in ranks]
    if 0 not in ranks.values():
        assert len(unseen) == 1, (ids, ranks)
        ranks[unseen[0]] = 0
    time.sleep(1.0)  # a routing-stats round reaches the routers
    yield handle, llm_handle, ranks
    serve.delete(APP)
    from actors.launcher import stop_router_profile_actors

    stop_router_profile_actors(read_config(CONFIG), namespace=ROUTER_NAMESPACE)


def test_overloaded_replica_is_avoided(llm_app):
    _, llm, ranks = llm_app
    overloaded = next(r for r, rank in ranks.items() if rank == 0)
    before = router_stats()
    served = Counter()
    for _ in range(15):
        served[llm.chat.remote(chat(unique_prompt())).result(timeout_s=30)["replica"]] += 1
    assert served[overloaded] == 0, served
    assert len(served) == REPLICAS - 1, served  # the others share the load
    after = router_stats()
    assert after["scheduled"] - before["scheduled"] >= 15


def test_resident_lora_adapter_is_preferred(llm_app):
    _, llm, _ = llm_app
    lora = llm.options(multiplexed_model_id="lora-x")
    first = lora.chat.remote(chat(unique_prompt())).result(timeout_s=30)["replica"]
    time.sleep(1.0)  # Serve tells the routers where the adapter is loaded
    served = Counter(lora.chat.remote(chat(unique_prompt())).result(timeout_s=30)["replica"] for _ in range(8))
    assert served == Counter({first: 8}), (first, served)
    # Serve's multiplexing alone would do that too: the decisions must be EPP's
    time.sleep(0.3)  # the routed hooks run on the router's loop
    decided = [d for d in recent_decisions(50) if d.model == "lora-x"][-8:]
    assert [(d.replica, d.how) for d in decided] == [(first, "scheduled")] * 8, decided


def test_long_prefix_sticks_to_one_replica_across_two_ingress_replicas(llm_app):
    ingress, _, ranks = llm_app
    shared = unique_prompt(4000)
    out = [ingress.chat.remote(chat(shared + f" question {i}")).result(timeout_s=30) for i in range(12)]
    callers = Counter(o["ingress"] for o in out)
    replicas = Counter(o["replica"] for o in out)
    assert len(callers) == 2, callers  # both ingress replicas (two routers) routed some
    assert len(replicas) == 1, replicas  # and all went where the prefix is
    assert ranks[next(iter(replicas))] != 0
    assert all(o["hit_blocks"] > 0 for o in out[1:]), [o["hit_blocks"] for o in out]
    stats = [ingress.stats.remote().result(timeout_s=30) for _ in range(6)]
    assert {s["ingress"] for s in stats} == set(callers)
    assert all(s["scheduled"] > 0 for s in stats)
    # each decided on its own mirror and learned the other's decisions through the profile actor
    assert all(s["mirror"]["followed"] > 0 and s["mirror"]["sent"] > 0 for s in stats), stats


@serve.deployment(ray_actor_options={"num_cpus": 0})
class LateIngress:
    """A router that starts after the others have routed: a new handle in a new replica."""

    def __init__(self) -> None:
        self.llm = serve.get_deployment_handle("FakeLLM", app_name=APP)

    async def chat(self, body: dict) -> dict:
        out = await self.llm.chat.remote(body)
        return {**out, "stats": router_stats()}


def test_a_router_that_starts_late_catches_up(llm_app):
    ingress, _, _ = llm_app
    shared = unique_prompt(4000)
    home = {ingress.chat.remote(chat(shared + f" question {i}")).result(timeout_s=30)["replica"] for i in range(4)}
    assert len(home) == 1, home
    app = "llm-router-late"
    serve.run(LateIngress.bind(), name=app, route_prefix=f"/{app}")
    try:
        out = serve.get_app_handle(app).chat.remote(chat(shared + " late question")).result(timeout_s=60)
    finally:
        serve.delete(app)
    stats = out["stats"]
    assert stats["scheduled"] == 1 and stats["fallback_total"] == 0, stats  # its own mirror decided
    assert stats["mirror"]["resets"] >= 1 and stats["mirror"]["followed"] >= 4, stats["mirror"]  # the log
    assert out["replica"] in home and out["hit_blocks"] > 0, (out, home)  # where the prefix is


def test_a_profile_actor_restart_under_the_routers_loses_no_request(llm_app):
    """The actor's state starts empty again: routers keep deciding on their mirrors meanwhile, then
    rebuild them from the new actor's log and send it their events again."""
    from actors.launcher import router_profile_actor_name
    from actors.profile_actor import config_digest
    from scheduler import dump_config

    _, llm, _ = llm_app
    name = router_profile_actor_name(config_digest(dump_config(read_config(CONFIG))), "default")
    actor = ray.get_actor(name, namespace=ROUTER_NAMESPACE)
    epoch = ray.get(actor.info.remote(), timeout=30)["event_log"]["epoch"]
    resets = router_stats()["mirror"]["resets"]
    pending = [llm.chat.remote(chat(unique_prompt())) for _ in range(4)]
    ray.kill(actor, no_restart=False)
    pending += [llm.chat.remote(chat(unique_prompt())) for _ in range(8)]
    out = [p.result(timeout_s=30) for p in pending]
    assert len(out) == 12 and all(o["choices"] for o in out)
    wait_for(lambda: router_stats()["mirror"]["resets"] > resets, 30, "the router to resync")
    assert profile_info(CONFIG)["event_log"]["epoch"] != epoch
    for _ in range(3):
        llm.chat.remote(chat(unique_prompt())).result(timeout_s=30)
    wait_for(lambda: profile_info(CONFIG)["events"]["response_complete"] >= 3, 10, "the new actor to learn")


def test_completions_reach_the_profile_actors(llm_app):
    _, llm, _ = llm_app
    before = profile_info(CONFIG)["events"]
    for _ in range(5):
        llm.chat.remote(chat(unique_prompt())).result(timeout_s=30)
    after = wait_for(
        lambda: (e := profile_info(CONFIG)["events"])["response_complete"] - before["response_complete"] >= 5 and e,
        10,
        "completions at the profile actor",
    )
    assert after["pre_request"] - before["pre_request"] >= 5
    assert router_stats()["completed"] >= 5


def test_scheduler_failure_falls_back_and_is_counted(ray_session, llm_app):
    app = "llm-router-fallback"
    serve.run(
        llm_deployment("FakeLLMNoEndpoint", NO_ENDPOINT_CONFIG, replicas=2),
        name=app,
        route_prefix=f"/{app}",
    )
    try:
        handle = serve.get_deployment_handle("FakeLLMNoEndpoint", app_name=app)
        before = router_stats()["fallbacks"]
        out = [handle.chat.remote(chat(unique_prompt())).result(timeout_s=60) for _ in range(6)]
        assert len(out) == 6 and all(o["choices"] for o in out)  # no request lost
        after = router_stats()["fallbacks"]
        fell_back = sum(after.values()) - sum(before.values())
        assert fell_back >= 6, (before, after)
        # no endpoint passes the filter: GIE's answer, ResourceExhausted, counted by its code
        assert after.get("scheduling_ResourceExhausted", 0) - before.get("scheduling_ResourceExhausted", 0) >= 6
    finally:
        serve.delete(app)
        from actors.launcher import stop_router_profile_actors

        stop_router_profile_actors(read_config(NO_ENDPOINT_CONFIG), namespace=ROUTER_NAMESPACE)


def test_replicas_that_publish_nothing_are_scraped_at_their_metrics_endpoint(ray_session, llm_app):
    """A replica with an HTTP endpoint (here its metadata's metrics URL; Serve's direct ingress gives
    one too) is read through its engine's /metrics page with the vLLM preset."""
    from serve_app.llm_router import router as llm_router

    app, blocks = "llm-router-scrape", 777
    serve.run(
        llm_deployment("FakeLLMScraped", CONFIG, replicas=2, publish_stats=False, pod={"num_gpu_blocks": blocks}),
        name=app,
        route_prefix=f"/{app}",
    )
    try:
        handle = serve.get_deployment_handle("FakeLLMScraped", app_name=app)
        for _ in range(4):
            handle.chat.remote(chat(unique_prompt())).result(timeout_s=60)

        def scraped_endpoints():
            for router in llm_router._routers():
                if router._deployment_id.name != "FakeLLMScraped":
                    continue
                replicas = list(router.curr_replicas.values())
                endpoints = [router.endpoint_of(r) for r in replicas]
                if len(endpoints) == 2 and all(e.metrics.cache_num_blocks == blocks for e in endpoints):
                    return replicas, endpoints  # only the page's vllm:cache_config_info says 777
            return None

        replicas, endpoints = wait_for(scraped_endpoints, 20, "scraped engine metrics")
        assert all("epp_engine" not in (r.routing_stats or {}) for r in replicas)  # nothing published
        assert all(e.metrics.cache_block_size == 16 for e in endpoints)
    finally:
        serve.delete(app)


def test_a_config_with_kv_events_is_refused_when_the_router_is_built(llm_app):
    """Precise prefix routing needs each replica's KV events, which a Serve router can not get:
    the router refuses the config when Serve builds it, naming the plugin and why, rather than run
    it as approximate mode; every caller gets that error, nothing hangs."""
    precise = (Path(__file__).resolve().parents[2] / "bench" / "configs" / "precise.yaml").read_text()
    app = "llm-router-precise"
    serve.run(llm_deployment("FakeLLMPrecise", precise, replicas=1), name=app, route_prefix=f"/{app}")
    try:
        handle = serve.get_deployment_handle("FakeLLMPrecise", app_name=app)
        for _ in range(2):  # every request, not only the first
            with pytest.raises(RouterConfigError, match=r"precise-prefix-cache-producer.*KV events"):
                handle.chat.remote(chat(unique_prompt())).result(timeout_s=60)
        assert router_stats()["refused"] >= 2
    finally:
        serve.delete(app)


def test_the_config_data_layer_drives_the_scrapers(ray_session, llm_app):
    """Replicas that publish nothing are scraped with the config's data layer: its extractor's
    mapping (the block count read from another label than the preset's) and its interval."""
    from serve_app.llm_router import router as llm_router

    app = "llm-router-data-layer"
    serve.run(
        llm_deployment("FakeLLMDataLayer", DATA_LAYER_CONFIG, replicas=1, publish_stats=False,
                       pod={"num_gpu_blocks": 777}),
        name=app,
        route_prefix=f"/{app}",
    )  # fmt: skip
    try:
        handle = serve.get_deployment_handle("FakeLLMDataLayer", app_name=app)
        handle.chat.remote(chat(unique_prompt())).result(timeout_s=60)

        def scraped():
            for router in llm_router._routers():
                if router._deployment_id.name == "FakeLLMDataLayer":
                    endpoints = [router.endpoint_of(r) for r in router.curr_replicas.values()]
                    if endpoints and all(e.metrics.cache_block_size == 16 for e in endpoints):
                        return router, endpoints
            return None

        router, endpoints = wait_for(scraped, 20, "scraped engine metrics")
        assert [e.metrics.cache_num_blocks for e in endpoints] == [16]  # the config's mapping, not 777
        assert router._scrapers.options.refresh_interval_s == 0.05
    finally:
        serve.delete(app)


def test_killed_replica_is_dropped_and_its_requests_fail_clearly(llm_app):
    """Last in the module: it kills a replica (Serve starts another)."""
    _, llm, ranks = llm_app
    slow = {**chat(unique_prompt()), "max_tokens": 500}  # ~3 s of simulated decode
    pending = [llm.chat.remote(dict(slow, messages=[{"role": "user", "content": unique_prompt()}])) for _ in range(6)]
    time.sleep(0.5)
    victim_name = next(r for r, rank in ranks.items() if rank != 0)
    victim = next(
        a for a in ray.util.list_named_actors(all_namespaces=True) if victim_name in a["name"]
    )
    ray.kill(ray.get_actor(victim["name"], namespace=victim["namespace"]), no_restart=True)
    failed = succeeded = 0
    started = time.monotonic()
    for response in pending:
        try:
            response.result(timeout_s=30)
            succeeded += 1
        except TimeoutError:
            raise AssertionError("a request hung after its replica was killed") from None
        except Exception as err:  # the request's replica died: a clear error, not a hang
            assert "died" in str(err).lower() or "actor" in str(err).lower(), err
            failed += 1
    assert time.monotonic() - started < 30
    assert failed + succeeded == len(pending)
    before = router_stats()["scheduled"]
    served = Counter(llm.chat.remote(chat(unique_prompt())).result(timeout_s=30)["replica"] for _ in range(8))
    assert victim_name not in served, served
    assert router_stats()["scheduled"] - before >= 8  # EPP routed around it (Serve alone would too)
