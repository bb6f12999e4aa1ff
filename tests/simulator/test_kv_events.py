"""The simulator's KV events: vLLM's events for exactly what its cache holds, evictions included."""

from __future__ import annotations

import asyncio
import random
import threading
import time

import aiohttp
import pytest

from ray_epp.kvevents import AllBlocksCleared, BlockHasher, BlockRemoved, BlockStored, KVEventBatch, ZmqEventSubscriber
from ray_epp.simulator import DEFAULT_MODEL, ClusterSim, PodConfig, SimCluster
from ray_epp.simulator.tokens import token_ids
from tests.simulator.helpers import completion, sim_request, text_tokens


class Mirror:
    """A pod's cache as its events tell it: a plain set of block hashes per pod."""

    def __init__(self) -> None:
        self.blocks: dict[str, set[int]] = {}
        self.stored: list[BlockStored] = []
        self.removed = 0
        self.lock = threading.Lock()

    def __call__(self, pod: str, batch: KVEventBatch) -> None:
        with self.lock:
            held = self.blocks.setdefault(pod, set())
            for e in batch.events:
                if isinstance(e, BlockStored):
                    assert not held & set(e.block_hashes), "a block stored twice without a removal"
                    held.update(e.block_hashes)
                    self.stored.append(e)
                elif isinstance(e, BlockRemoved):
                    assert set(e.block_hashes) <= held, "removal of a block never stored"
                    held.difference_update(e.block_hashes)
                    self.removed += len(e.block_hashes)
                elif isinstance(e, AllBlocksCleared):
                    held.clear()


def pressure_workload(n: int = 120, groups: int = 12, seed: int = 3) -> list:
    rng = random.Random(seed)
    prefixes = [text_tokens(96, f"g{g}") for g in range(groups)]
    return [
        sim_request(f"r{i}", i * 0.01, prefixes[rng.randrange(groups)] + text_tokens(rng.randrange(8, 40), f"u{i}"), 8)
        for i in range(n)
    ]


def test_cluster_sim_events_replay_to_exactly_each_pods_cache() -> None:
    pods = [PodConfig(name=f"p{i}", num_gpu_blocks=160, block_size=16, hash_seed="0") for i in range(2)]
    mirror = Mirror()
    rng = random.Random(1)
    sim = ClusterSim(pods, lambda req, views, now: views[rng.randrange(2)].name, on_kv_events=mirror)
    report = sim.run(pressure_workload())
    assert all(r.status == "ok" for r in report.results)
    for eng in sim.engines:
        assert eng.kv.evictions > 0, "the workload must make the pod evict"
        assert mirror.blocks[eng.name] == set(eng.kv.cached)
    assert mirror.removed == sum(e.kv.evictions for e in sim.engines)
    # every key is vLLM's: a first block's hashes are BlockHasher's over the event's own tokens
    hasher = BlockHasher(16, "sha256_cbor", seed="0")
    firsts = [e for e in mirror.stored if e.parent_block_hash is None]
    assert firsts
    for e in firsts:
        assert hasher.hashes(e.token_ids) == e.block_hashes
    for e in mirror.stored:
        assert len(e.token_ids) == 16 * len(e.block_hashes) and e.block_size == 16


def test_keys_follow_the_hash_algorithm_seed_and_lora() -> None:
    prompt = text_tokens(40, "k")
    seen: dict[tuple[str, str], list[int]] = {}
    for algo in ("sha256_cbor", "sha256"):
        for seed in ("0", "7"):
            cfg = PodConfig(name="a", prefix_caching_hash_algo=algo, hash_seed=seed, kv_events=True,
                            lora_adapters=["ad"])
            mirror = Mirror()
            ClusterSim([cfg], lambda *a: "a", on_kv_events=mirror).run([sim_request("r", 0.0, prompt, 2)])
            got = [h for e in mirror.stored for h in e.block_hashes]
            assert got == BlockHasher(16, algo, seed).hashes(token_ids(prompt))
            seen[(algo, seed)] = got
    assert len({tuple(v) for v in seen.values()}) == 4
    mirror = Mirror()
    cfg = PodConfig(name="a", hash_seed="0", lora_adapters=["ad"])
    ClusterSim([cfg], lambda *a: "a", on_kv_events=mirror).run([sim_request("r", 0.0, prompt, 2, model="ad")])
    assert mirror.stored[0].lora_name == "ad"
    assert [h for e in mirror.stored for h in e.block_hashes] == BlockHasher(16, seed="0").hashes(
        token_ids(prompt), lora_name="ad")


async def _wait(pred, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def test_a_pod_publishes_its_cache_over_zmq_and_serves_tokenize() -> None:
    cfg = PodConfig(name="a", num_gpu_blocks=40, kv_events=True, hash_seed="0")
    mirror = Mirror()
    async with SimCluster([cfg], time_scale=0) as c, aiohttp.ClientSession() as s:
        pod = c.pods[0]
        kv = pod.info()["kvEvents"]
        assert kv["endpoint"].startswith("tcp://127.0.0.1:") and kv["replay"].startswith("tcp://127.0.0.1:")
        with ZmqEventSubscriber("a", kv["endpoint"], mirror, kv["replay"]) as sub:
            for i in range(12):  # 12 prompts of 10 blocks through a 40-block cache: evictions
                body = completion(text_tokens(160, f"q{i}"), 2)
                async with s.post(pod.url + "/v1/completions", json=body) as r:
                    assert r.status == 200
            await _wait(lambda: mirror.blocks.get("a") == set(pod.engine.kv.cached))
            assert pod.engine.kv.evictions > 0 and mirror.removed == pod.engine.kv.evictions
            assert sub.status().lost == 0

            prompt = text_tokens(33, "t")
            async with s.post(pod.url + "/tokenize", json={"model": DEFAULT_MODEL, "prompt": prompt}) as r:
                out = await r.json()
            assert out == {"count": 33, "max_model_len": cfg.max_model_len, "tokens": token_ids(prompt),
                           "token_strs": None}
            msgs = [{"role": "user", "content": "hello there"}]
            async with s.post(pod.url + "/tokenize", json={"model": DEFAULT_MODEL, "messages": msgs}) as r:
                chat = await r.json()
            assert chat["count"] == len(chat["tokens"]) > 10  # the template's tokens too
            for bad, status in (({"model": "nope", "prompt": "x"}, 404), ({"model": DEFAULT_MODEL}, 400),
                                ({"prompt": {"a": 1}}, 400), ([1, 2], 400)):
                async with s.post(pod.url + "/tokenize", json=bad) as r:
                    assert r.status == status, bad
            async with s.post(pod.url + "/tokenize", data=b"{not json") as r:
                assert r.status == 400

            async with s.post(pod.url + "/reset_prefix_cache") as r:
                assert r.status == 200
            await _wait(lambda: mirror.blocks["a"] == set())
            assert pod.engine.kv.cached == {}


async def test_a_restarted_pod_starts_with_all_blocks_cleared() -> None:
    mirror = Mirror()
    cfg = PodConfig(name="a", kv_events=True)
    async with SimCluster([cfg], time_scale=0) as c, aiohttp.ClientSession() as s:
        kv = c.pods[0].info()["kvEvents"]
        port = int(kv["endpoint"].rsplit(":", 1)[1])
        sub = ZmqEventSubscriber("a", kv["endpoint"], mirror, kv["replay"]).start()
        # The pod sends one batch at once, perhaps before the subscription reaches it (ZMQ's slow
        # joiner): the subscriber's replay on connecting must still deliver it.
        async with s.post(c.pods[0].url + "/v1/completions", json=completion(text_tokens(64, "r"), 2)) as r:
            assert r.status == 200
        await _wait(lambda: len(mirror.blocks.get("a", ())) == 4)
    try:
        # the same pod again on the same event port: its first batch clears what the old one held
        async with SimCluster([cfg.model_copy(update={"kv_events_port": port})], time_scale=0):
            await _wait(lambda: mirror.blocks["a"] == set() and sub.status().resets >= 1)
    finally:
        sub.stop()


def test_a_taken_event_port_is_a_clear_error() -> None:
    import zmq

    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.PUB)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    try:
        async def start() -> None:
            async with SimCluster([PodConfig(name="a", kv_events=True, kv_events_port=port)], time_scale=0):
                pass

        with pytest.raises(OSError, match="cannot bind KV-event publisher"):
            asyncio.run(start())
    finally:
        sock.close(linger=0)


def test_token_ids_are_the_chunks_bytes_or_crc() -> None:
    assert token_ids("abcdefgh") == [int.from_bytes(b"abcd", "big"), int.from_bytes(b"efgh", "big")]
    assert token_ids("abcdef") == [int.from_bytes(b"abcd", "big"), int.from_bytes(b"ef", "big")]
    ids = token_ids("abcdé and more")
    assert ids[0] == int.from_bytes(b"abcd", "big") and ids[1] >= 1 << 32 and len(ids) == 4
    assert token_ids([5, 6]) == [5, 6]


async def test_epp_sim_kv_events_names_each_pods_event_ports(tmp_path, capsys) -> None:
    import argparse
    import json

    from ray_epp.simulator.cli import add_sim_arguments, serve

    args = add_sim_arguments(argparse.ArgumentParser()).parse_args(
        ["--pods", "2", "--base-port", "0", "--time-scale", "0", "--kv-events", "--pods-json", str(tmp_path / "p.json")]
    )
    stop = asyncio.Event()
    task = asyncio.create_task(serve(args, stop))
    await _wait(lambda: (tmp_path / "p.json").exists())
    pods = json.loads((tmp_path / "p.json").read_text())
    stop.set()
    await task
    endpoints = [p["kvEvents"]["endpoint"] for p in pods] + [p["kvEvents"]["replay"] for p in pods]
    assert len(set(endpoints)) == 4 and all(e.startswith("tcp://127.0.0.1:") for e in endpoints)
    out = capsys.readouterr().out
    assert f"kv-events={pods[0]['kvEvents']['endpoint']} replay={pods[0]['kvEvents']['replay']}" in out
