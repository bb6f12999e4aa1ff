"""The simulated pod's CPU-offload tier: evicted blocks move to host memory and are published there
(medium CPU), a later hit loads them back cheaper than recomputing, and the precise index fed the
pod's published bytes holds exactly what each tier holds."""

from __future__ import annotations

import aiohttp
import pytest
from pydantic import ValidationError

from ray_epp.kvevents import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    ZmqEventSubscriber,
    decode_batch,
    encode_batch,
)
from ray_epp.simulator import ClusterSim, PodConfig, SimCluster
from ray_epp.simulator.engine import Engine
from scheduler.plugins.support.prefix.precise_index import PreciseIndex
from tests.simulator.helpers import completion, run_one_pod, sim_request, text_tokens
from tests.simulator.test_kv_events import _wait, pressure_workload


class TierMirror:
    """A pod's cache as its events tell it, per medium; every batch passes through vLLM's bytes."""

    def __init__(self) -> None:
        self.held: dict[str, set[int]] = {"GPU": set(), "CPU": set()}
        self.events: list[object] = []

    def __call__(self, pod: str, batch: KVEventBatch) -> None:
        for e in decode_batch(encode_batch(batch)).events:
            self.events.append(e)
            if isinstance(e, BlockStored):
                held = self.held[e.medium or "GPU"]
                assert not held & set(e.block_hashes), "a block stored twice in one tier without a removal"
                held.update(e.block_hashes)
            elif isinstance(e, BlockRemoved):
                held = self.held[e.medium or "GPU"]
                assert set(e.block_hashes) <= held, "removal of a block the tier does not hold"
                held.difference_update(e.block_hashes)
            elif isinstance(e, AllBlocksCleared):
                for held in self.held.values():
                    held.clear()


def offload_pod(cpu_blocks: int = 200, **kw) -> PodConfig:
    return PodConfig(name="p", num_gpu_blocks=80, block_size=16, hash_seed="0", cpu_offload_blocks=cpu_blocks, **kw)


def test_the_tier_is_off_by_default_and_sized_by_a_count():
    assert PodConfig().cpu_offload_blocks == 0
    assert Engine(PodConfig()).kv.cpu is None
    for bad in ({"cpu_offload_blocks": -1}, {"timing": {"cpu_load_per_token_s": -1e-6}}):
        with pytest.raises(ValidationError, match="greater than or equal"):
            PodConfig.model_validate(bad)


def test_evicted_blocks_move_to_the_cpu_and_come_back_on_a_hit():
    mirror = TierMirror()
    sim = ClusterSim([offload_pod()], lambda req, views, now: "p", on_kv_events=mirror)
    report = sim.run(pressure_workload(n=120, groups=12))
    assert all(r.status == "ok" for r in report.results)
    eng = sim.engines[0]
    cpu = eng.kv.cpu
    assert cpu is not None
    assert eng.kv.evictions > 0 and cpu.offloaded == eng.kv.evictions
    assert cpu.taken > 0 and eng.cpu_loaded_tokens == cpu.taken * 16
    assert mirror.held["GPU"] == set(eng.kv.cached)
    assert mirror.held["CPU"] == set(cpu.lru)
    cpu_stores = [e for e in mirror.events if isinstance(e, BlockStored) and e.medium == "CPU"]
    assert cpu_stores and all(e.token_ids == [] and e.parent_block_hash is None for e in cpu_stores)  # as vLLM


def test_blocks_past_the_cpu_capacity_fall_out_oldest_first():
    mirror = TierMirror()
    sim = ClusterSim([offload_pod(cpu_blocks=30)], lambda req, views, now: "p", on_kv_events=mirror)
    sim.run(pressure_workload(n=120, groups=12))
    cpu = sim.engines[0].kv.cpu
    assert cpu is not None and cpu.dropped > 0 and len(cpu) == 30
    assert mirror.held["CPU"] == set(cpu.lru)
    dropped = [h for e in mirror.events if isinstance(e, BlockRemoved) and e.medium == "CPU" for h in e.block_hashes]
    assert len(dropped) == cpu.dropped + cpu.taken


def _evict_then_repeat(cfg: PodConfig) -> dict:
    """A 10-block prefix, then enough other prompts to push it off the GPU, then the prefix again."""
    shared = text_tokens(160, "s")
    reqs = [sim_request("first", 0.0, shared + text_tokens(8, "a"))]
    reqs += [sim_request(f"fill{i}", 0.5 + 0.2 * i, text_tokens(160, f"f{i}")) for i in range(8)]
    reqs.append(sim_request("again", 3.0, shared + text_tokens(8, "b")))
    return run_one_pod(cfg, reqs)


def test_a_cpu_hit_is_loaded_cheaper_than_recomputing():
    with_cpu = _evict_then_repeat(offload_pod())
    without = _evict_then_repeat(offload_pod(cpu_blocks=0))
    gpu_only = run_one_pod(
        offload_pod(),
        [
            sim_request("first", 0.0, text_tokens(160, "s") + text_tokens(8, "a")),
            sim_request("again", 3.0, text_tokens(160, "s") + text_tokens(8, "b")),
        ],
    )
    assert without["again"].cached_tokens == 0 and with_cpu["again"].cached_tokens == 160
    assert gpu_only["again"].cached_tokens == 160
    # loading 160 tokens (0.4 ms) beats computing them (4.8 ms), and a GPU hit beats both
    assert gpu_only["again"].ttft < with_cpu["again"].ttft < without["again"].ttft
    load = 160 * offload_pod().timing.cpu_load_per_token_s
    assert with_cpu["again"].ttft == pytest.approx(gpu_only["again"].ttft + load, rel=1e-6)


def test_the_same_seed_gives_the_same_run():
    def run() -> list[tuple[str, float, int]]:
        sim = ClusterSim([offload_pod(cpu_blocks=40)], lambda req, views, now: "p", seed=5)
        return [(r.request_id, r.ttft, r.cached_tokens) for r in sim.run(pressure_workload(seed=9)).results]

    assert run() == run()


def test_the_precise_index_fed_the_pods_bytes_holds_each_tier():
    """The index keeps a CPU block (named only, as vLLM's offloading names it) by the key its GPU
    store gave it, and drops it from the tier its removal names."""
    index = PreciseIndex(16)
    mirror = TierMirror()

    def feed(pod: str, batch: KVEventBatch) -> None:
        mirror(pod, batch)
        index.apply(pod, decode_batch(encode_batch(batch)).events)

    sim = ClusterSim([offload_pod(cpu_blocks=60)], lambda req, views, now: "p", on_kv_events=feed)
    sim.run(pressure_workload(n=120, groups=12, seed=4))
    eng = sim.engines[0]
    assert index.pod_blocks("p") == len(eng.kv.cached)
    assert index.offloaded_blocks("p") == {"cpu": len(eng.kv.cpu.lru)}  # type: ignore[union-attr]
    assert index.counts.skipped == 0 and index.counts.unknown_removed == 0


async def test_a_pod_publishes_its_cpu_tier_over_zmq() -> None:
    cfg = PodConfig(name="a", num_gpu_blocks=40, kv_events=True, hash_seed="0", cpu_offload_blocks=50)
    mirror = TierMirror()
    async with SimCluster([cfg], time_scale=0) as c, aiohttp.ClientSession() as s:
        pod = c.pods[0]
        kv = pod.info()["kvEvents"]
        with ZmqEventSubscriber("a", kv["endpoint"], mirror, kv["replay"]) as sub:
            for i in [*range(6), 0]:  # 6 prompts of 10 blocks through 40: the first is on the CPU, then back
                async with s.post(pod.url + "/v1/completions", json=completion(text_tokens(160, f"q{i}"), 2)) as r:
                    assert r.status == 200
            cpu = pod.engine.kv.cpu
            assert cpu is not None and cpu.taken > 0
            await _wait(lambda: mirror.held["GPU"] == set(pod.engine.kv.cached) and mirror.held["CPU"] == set(cpu.lru))
            assert sub.status().lost == 0
            async with s.post(pod.url + "/reset_prefix_cache") as r:
                assert r.status == 200
            await _wait(lambda: not mirror.held["GPU"] and not mirror.held["CPU"])
            assert len(cpu) == 0
