"""The control plane at 1,000 pods, end to end on this machine: farm pods (ray_epp/simulator/
pod_farm.py, 1,000 ports over two processes, their load drifting) scraped by the real metrics
actors, reported to the datastore, followed through the node's snapshot relay by two profile
shards and a gateway view, and
decisions made on the whole pool with candidate subsetting."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.ray

ray = pytest.importorskip("ray")

from actors import ProfileCall, start_epp_actors, stop_epp_actors  # noqa: E402
from ray_epp.simulator.pod_farm import start_pod_farm  # noqa: E402
from scheduler import CycleState, LLMRequest  # noqa: E402
from tests.actors.support import fast_options, wait_for  # noqa: E402

PODS = 1000
CONFIG = Path(__file__).parents[2] / "bench" / "configs" / "default-subset.yaml"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


@ray.remote(num_cpus=0)
class GatewayView:
    """A gateway replica's view of the pool (serve_app/gateway/endpoint_view.py), on this node."""

    def __init__(self, datastore) -> None:
        from serve_app.gateway.endpoint_view import EndpointView

        self._view = EndpointView(datastore, watch_timeout_s=2.0, models_every_s=3600)
        self._view.start()

    async def state(self) -> tuple[int, int, str]:
        return self._view.version, len(self._view.endpoints), self._view._feed.source


def request(i: int) -> LLMRequest:
    prompt = f"[system prompt {i % 8}] " + "lorem ipsum " * 200 + f"question {i}"
    return LLMRequest(request_id=f"k{i}", target_model=MODEL, body={"model": MODEL, "prompt": prompt})


def test_a_thousand_pod_pool_end_to_end(ray_session):
    started = time.monotonic()
    options = fast_options(
        "t-1000",
        refresh_interval_s=1.0,  # 1,000 scrapes a second: what two shared cores can take beside the rest
        heartbeat_s=2.0,
        scrape_timeout_s=2.0,
        staleness_threshold_s=10.0,
        check_interval_s=0.5,
        models_refresh_s=60.0,
        max_pods_per_metrics_actor=250,
        profile_shards=2,
        snapshot_relays=True,
        snapshot_min_interval_s=0.025,
        watch_timeout_s=2.0,
        plugin_modules=[],
    )
    with start_pod_farm(PODS, processes=2, drift_s=0.1, drift_pods=16) as farm:
        pods = [{"name": p["name"], "address": p["address"], "port": p["port"]} for p in farm.pods]
        epp = start_epp_actors(CONFIG.read_text(), pods, options=options, timeout_s=120)
        try:
            names = {p["name"] for p in pods}
            # Reports: every pod scraped and routable.
            wait_for(lambda: len(ray.get(epp.datastore.snapshot.remote())[1]) == PODS, 30, what="1,000 ready pods")
            groups = ray.get(epp.datastore.metrics_actor_groups.remote())
            assert len(groups) == 4 and sum(len(g["pods"]) for g in groups.values()) == PODS

            # Deltas: the pool keeps changing (the farm's drift), and every reader follows it
            # through the relay: no reader holds a stale pool.
            view = GatewayView.remote(epp.datastore)
            shards = epp.shards["default"]
            assert len(shards) == 2
            first = ray.get(epp.datastore.version.remote())

            def caught_up() -> bool:
                now = ray.get(epp.datastore.version.remote())
                infos = ray.get([s.info.remote() for s in shards])
                version, size, source = ray.get(view.state.remote())
                return (
                    now > first
                    and all(i["version"] > first and len(i["endpoints"]) == PODS for i in infos)
                    and version > first
                    and size == PODS
                    and source == "relay"
                )

            wait_for(caught_up, 60, what="readers past the first version, through the relay")

            # Decisions on the whole pool, by both shards, each scoring a bounded candidate set.
            calls = [
                [ProfileCall(request(i), CycleState(), want_trace=(i == 0)) for i in range(s, 60, 2)] for s in (0, 1)
            ]
            outcomes = [
                o for shard, batch in zip(shards, calls, strict=True) for o in ray.get(shard.run_batch.remote(batch))
            ]
            assert all(o.error is None for o in outcomes)
            targets = [o.result.target_endpoints[0].name for o in outcomes]
            assert set(targets) <= names and len(set(targets)) >= 10, targets
            trace = outcomes[0].trace
            kept = next(f["kept"] for f in trace["filters"] if f["type"] == "candidate-subset-filter")
            assert len(kept) == 32
        finally:
            stop_epp_actors(epp)
    print(f"1,000-pod pool end to end: {time.monotonic() - started:.1f} s")
