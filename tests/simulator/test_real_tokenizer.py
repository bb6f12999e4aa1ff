"""A simulated pod with a real tokenizer (`PodConfig.tokenizer`): it counts, caches, hashes,
publishes and /tokenize-answers the prompt's real token ids, chat requests through the chat
template, as a vLLM serving that tokenizer does; without one, the 4-characters rule holds."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import aiohttp
import pytest

from bench.tokenizer_fixture import CORPUS, make_tokenizer
from ray_epp.kvevents import BlockHasher, ZmqEventSubscriber
from ray_epp.simulator import DEFAULT_MODEL, ClusterSim, PodConfig, SimCluster, SimRequest
from ray_epp.simulator.cli import add_sim_arguments, pod_configs_from_args
from scheduler.plugins.support.token_cache import PrefixTokenCache
from scheduler.plugins.support.tokenizer_backends import LocalTokenizer, VLLMHttpTokenizer
from tests.simulator.helpers import completion, sim_request
from tests.simulator.test_kv_events import Mirror, _wait

WORDS = " ".join(CORPUS).split()


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory) -> Path:
    return make_tokenizer(tmp_path_factory.mktemp("tok"))


def prose(n_words: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def test_a_pod_counts_caches_and_publishes_the_tokenizers_ids(tokenizer_path) -> None:
    tok = LocalTokenizer(tokenizer_path)  # the router side's reader of the same file
    system = prose(300, 1)
    prompts = [system + " " + prose(20, 10 + i) for i in range(3)]
    cfg = PodConfig(name="a", tokenizer=str(tokenizer_path), hash_seed="0")
    mirror = Mirror()
    sim = ClusterSim([cfg], lambda *a: "a", on_kv_events=mirror)
    report = sim.run([sim_request(f"r{i}", i * 1.0, p, 2) for i, p in enumerate(prompts)])
    ids = [tok.encode(p, True) for p in prompts]
    assert [r.prompt_tokens for r in report.results] == [len(i) for i in ids]
    assert len(ids[0]) != -(-len(prompts[0]) // 4), "the fixture's ratio is not 4 characters a token"
    # the later prompts hit the shared system prompt's full blocks, counted in real tokens
    common = next(k for k in range(len(ids[0])) if ids[0][k] != ids[1][k])
    assert report.results[1].cached_tokens == common // 16 * 16 > 0
    first = mirror.stored[0]
    assert first.parent_block_hash is None and first.token_ids == ids[0][: len(first.token_ids)]
    assert BlockHasher(16, seed="0").hashes(first.token_ids) == first.block_hashes
    assert mirror.blocks["a"] == set(sim.engines[0].kv.cached)


def test_chat_requests_go_through_the_chat_template(tokenizer_path) -> None:
    tok = LocalTokenizer(tokenizer_path)
    msgs = [{"role": "system", "content": prose(60, 2)}, {"role": "user", "content": "What now?"}]
    body = {"model": DEFAULT_MODEL, "messages": msgs, "max_tokens": 2, "ignore_eos": True}
    cfg = PodConfig(name="a", tokenizer=str(tokenizer_path))
    report = ClusterSim([cfg], lambda *a: "a").run([SimRequest.from_body("c", 0.0, body)])
    rendered = tok.render_chat(msgs)
    assert rendered is not None and rendered.startswith("<s><|system|>")
    assert report.results[0].prompt_tokens == len(tok.encode(rendered, False))


def test_a_tokenizer_without_a_chat_template_refuses_chat(tmp_path) -> None:
    path = make_tokenizer(tmp_path)
    path.with_name("tokenizer_config.json").unlink()
    body = {"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    cfg = PodConfig(name="a", tokenizer=str(path))
    report = ClusterSim([cfg], lambda *a: "a").run([SimRequest.from_body("c", 0.0, body)])
    assert report.results[0].status == "rejected" and "chat template" in report.results[0].error


def test_without_a_tokenizer_a_token_is_still_four_characters() -> None:
    prompt = prose(200, 3)
    report = ClusterSim([PodConfig(name="a")], lambda *a: "a").run([sim_request("r", 0.0, prompt, 2)])
    assert report.results[0].prompt_tokens == -(-len(prompt) // 4)


def test_a_missing_tokenizer_file_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(ValueError, match="tokenizer"):
        ClusterSim([PodConfig(name="a", tokenizer=str(tmp_path / "none.json"))], lambda *a: "a")
    args = add_sim_arguments(__import__("argparse").ArgumentParser()).parse_args(
        ["--tokenizer", str(tmp_path / "none.json")])
    with pytest.raises(ValueError, match="not a file"):
        pod_configs_from_args(args)


async def test_tokenize_over_http_matches_the_pods_cache_and_the_token_cache(tokenizer_path) -> None:
    """What a router's token producer gets from the pod's /tokenize (its prefix cache: a cached
    head + a rest tokenized without special tokens) is what the pod hashes and publishes."""
    tok = LocalTokenizer(tokenizer_path)
    cfg = PodConfig(name="a", tokenizer=str(tokenizer_path), kv_events=True, hash_seed="0")
    mirror = Mirror()
    system = prose(400, 4)
    async with SimCluster([cfg], time_scale=0) as c, aiohttp.ClientSession() as s:
        pod = c.pods[0]
        kv = pod.info()["kvEvents"]
        with ZmqEventSubscriber("a", kv["endpoint"], mirror, kv["replay"]):
            prompt = system + " " + prose(15, 5)
            async with s.post(pod.url + "/v1/completions", json=completion(prompt, 2)) as r:
                usage = (await r.json())["usage"]
            ids = tok.encode(prompt, True)
            assert usage["prompt_tokens"] == len(ids)
            await _wait(lambda: mirror.blocks.get("a") == set(pod.engine.kv.cached) != set())
            stored = [t for e in mirror.stored for t in e.token_ids]
            assert stored == ids[: len(stored)] and len(stored) == len(ids) // 16 * 16

            await asyncio.to_thread(_token_producer_view, pod.url, tok, system)  # sync client: off the loop


def _token_producer_view(url: str, tok: LocalTokenizer, system: str) -> None:
    http = VLLMHttpTokenizer(url, DEFAULT_MODEL, 5.0, 5.0)
    try:
        cache = PrefixTokenCache(chunk_chars=256)
        for i in range(3):  # the second prompt caches the shared head, the third uses it
            other = system + " " + prose(15, 20 + i)
            assert cache.tokens(other, http.encode) == tok.encode(other, True)
        assert cache.counts.prefix_hits >= 1
        msgs = [{"role": "user", "content": system}]
        assert http.encode_chat(msgs) == tok.encode(tok.render_chat(msgs) or "", False)
    finally:
        http.close()
