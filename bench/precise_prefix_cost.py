"""What precise prefix routing costs per request, against the approximate index at the same prompt
lengths: the lookup (block keys + the index walk, with a pod holding the whole prompt among 16
pods; the precise keys from the tokens alone, and with the shared prefix's keys kept on the token
cache's run, as the token producer hands them over; and a prompt no pod holds, where the precise
walk stops after one block), and the token producer's added latency, cold
(a new prefix) and hot (a cached prefix, a new rest), for a local tokenizer.json and for vLLM's
/tokenize over HTTP on 127.0.0.1 (a real server with the same tokenizer). With speculative indexing
(llm-d's `speculativeIndexing`): the same lookups with the predictions of the last 2 s of traffic
present (50 req/s), and what a prediction adds per request. Tokens per character
follow the bench tokenizer (a small BPE: more tokens per character than a real model's, so token
counts are upper bounds for the lengths given).

    python -m bench.precise_prefix_cost [--lengths 1000,4000,16000] [--reps 200]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

from bench.tokenizer_fixture import CORPUS, TokenizeServer, make_tokenizer
from bench.workloads.common import random_words
from scheduler.plugins.support.prefix import PrefixIndex, hash_prompt
from scheduler.plugins.support.prefix.precise_index import PreciseIndex
from scheduler.plugins.support.prefix.speculative_entries import SpeculativeEntries
from scheduler.plugins.support.token_cache import PrefixTokenCache
from scheduler.plugins.support.tokenizer_backends import LocalTokenizer, VLLMHttpTokenizer

PODS = 16
BLOCK = 16


def text_of(tokens: int, rng: random.Random) -> str:
    """About `tokens` * 4 characters of corpus words."""
    return random_words(rng, " ".join(CORPUS).split(), tokens * 4)


def us(samples: list[float]) -> str:
    return f"{statistics.median(samples) * 1e6:.1f}"


def lookup_costs(length: int, tok: LocalTokenizer, reps: int, block: int) -> dict[str, str]:
    """Both indexes with `block`-token blocks (the approximate one's are 4 characters a token),
    over `reps` prompts that share one long prefix and differ in a short question. The precise
    side twice: keys from the tokens alone (every prompt hashed whole), and with the token
    cache's runs (the shared prefix's keys kept on its run: each prompt hashes only its rest)."""
    rng = random.Random(length)
    text = text_of(length, rng)
    approx, precise = PrefixIndex(), PreciseIndex(block, default_capacity=100_000)
    for p in range(PODS):  # every pod holds some other prompt; pod 0 holds this one too
        other = text_of(length, rng)
        approx.add(hash_prompt(other, "m", block, 2048), f"pod-{p}")
        precise.blocks.add(precise.keys(tok.encode(other, True)), f"pod-{p}", 100_000)
    approx.add(hash_prompt(text, "m", block, 2048), "pod-0")
    precise.blocks.add(precise.keys(tok.encode(text, True)), "pod-0", 100_000)
    cache = PrefixTokenCache()
    prompts = [f"{text} question {i}?" for i in range(reps)]
    runs = [cache.run(p, tok.encode, tok.encode_offsets) for p in prompts]  # tokenizing is timed apart
    fresh = [(p, tok.encode(p, True)) for p in (text_of(length, rng) for _ in range(min(reps, 50)))]
    max_blocks = 131072 // block
    a, whole, kept = [], [], []
    for prompt, run in zip(prompts, runs, strict=True):
        t0 = time.perf_counter()
        approx.match(hash_prompt(prompt, "m", block, max_blocks))
        t1 = time.perf_counter()
        precise.lookup(run.ids, max_blocks)
        t2 = time.perf_counter()
        precise.lookup(run.ids, max_blocks, run)
        t3 = time.perf_counter()
        a.append(t1 - t0)
        whole.append(t2 - t1)
        kept.append(t3 - t2)
    a_new, p_new = [], []  # prompts no pod holds (unique traffic): the precise walk stops at block 1
    for _ in range(max(1, reps // len(fresh))):
        for prompt, ids in fresh:
            t0 = time.perf_counter()
            approx.match(hash_prompt(prompt, "m", block, max_blocks))
            t1 = time.perf_counter()
            precise.lookup(ids, max_blocks)
            t2 = time.perf_counter()
            a_new.append(t1 - t0)
            p_new.append(t2 - t1)
    base = statistics.median(a)
    return {
        "tokens": str(len(runs[0].ids)),
        "approx": us(a),
        "precise": us(whole),
        "ratio": f"{statistics.median(whole) / base:.2f}",
        "kept": us(kept),
        "kept_ratio": f"{statistics.median(kept) / base:.2f}",
        "new_approx": us(a_new),
        "new_precise": us(p_new),
        "new_ratio": f"{statistics.median(p_new) / statistics.median(a_new):.3f}",
    }


SPECULATION_RATE = 50.0  # req/s: with a 2 s TTL, ~100 predictions held


def speculation_costs(length: int, tok: LocalTokenizer, reps: int, block: int) -> dict[str, str]:
    """Per request, with speculative indexing on: the lookup as the producer then makes it (every
    prompt's keys, then the walk of the confirmed and the predicted entries) against the lookup
    without it, for prompts on a cached prefix (kept keys) and prompts no pod holds (the lookup
    alone stops after one block; speculation must hash them whole), and the prediction itself
    (`SpeculativeEntries.add`, expiring the oldest as the clock moves at SPECULATION_RATE)."""
    rng = random.Random(length + 2)
    text = text_of(length, rng)
    plain, spec = PreciseIndex(block, 100_000), PreciseIndex(block, 100_000)
    spec.speculative = SpeculativeEntries(2.0)
    for p in range(PODS):
        keys = plain.keys(tok.encode(text_of(length, rng), True))
        plain.blocks.add(keys, f"pod-{p}", 100_000)
        spec.blocks.add(keys, f"pod-{p}", 100_000)
    held = plain.keys(tok.encode(text, True))
    plain.blocks.add(held, "pod-0", 100_000)
    spec.blocks.add(held, "pod-0", 100_000)
    cache = PrefixTokenCache()
    prompts = [f"{text} question {i}?" for i in range(reps)]
    runs = [cache.run(p, tok.encode, tok.encode_offsets) for p in prompts]
    fresh = [tok.encode(text_of(length, rng), True) for _ in range(min(reps, 50))]
    max_blocks = 131072 // block
    now, step = 0.0, 1.0 / SPECULATION_RATE
    for i in range(int(2.0 * SPECULATION_RATE)):  # the steady state: 2 s of predictions held
        spec.speculative.add(f"pod-{i % PODS}", plain.keys(fresh[i % len(fresh)]), now)
        now += step
    off, on, predict, off_new, on_new = [], [], [], [], []
    for i, run in enumerate(runs):
        ids = fresh[i % len(fresh)]
        t0 = time.perf_counter()
        plain.lookup(run.ids, max_blocks, run)
        t1 = time.perf_counter()
        spec.speculative.expire(now)
        keys = spec.keys(run.ids, max_blocks, run)
        spec.match(keys)
        t2 = time.perf_counter()
        spec.speculative.add(f"pod-{i % PODS}", keys, now)
        t3 = time.perf_counter()
        plain.lookup(ids, max_blocks)
        t4 = time.perf_counter()
        spec.match(spec.keys(ids, max_blocks))
        t5 = time.perf_counter()
        off.append(t1 - t0)
        on.append(t2 - t1)
        predict.append(t3 - t2)
        off_new.append(t4 - t3)
        on_new.append(t5 - t4)
        now += step
    return {
        "off": us(off),
        "on": us(on),
        "predict": us(predict),
        "off_new": us(off_new),
        "on_new": us(on_new),
        "held": str(len(spec.speculative)),
    }


def tokenize_costs(length: int, encode, offsets, reps: int) -> dict[str, str]:
    rng = random.Random(length + 1)
    shared = text_of(length, rng)
    cold, hot = [], []
    for i in range(reps):
        cache = PrefixTokenCache()
        t0 = time.perf_counter()
        cache.tokens(shared + f" question {i}?", encode, offsets)
        t1 = time.perf_counter()
        if offsets is None:  # HTTP: the second prompt reaching a cut keeps the prefix
            cache.tokens(shared + f" second {i}?", encode, offsets)
        t2 = time.perf_counter()
        cache.tokens(shared + f" another one {i}?", encode, offsets)
        t3 = time.perf_counter()
        cold.append(t1 - t0)
        hot.append(t3 - t2)
    return {"cold": f"{statistics.median(cold) * 1e3:.3f}", "hot": f"{statistics.median(hot) * 1e3:.3f}"}


def table(
    header: str, cost, columns: list[tuple[str, int]], tok: LocalTokenizer, lengths: list[int], reps: int
) -> None:
    """One printed table: a row per block size and prompt length, `cost`'s figures in `columns`."""
    print(header)
    for block in (16, 64):
        for n in lengths:
            r = cost(n, tok, reps, block)
            print(f"  ~{n * 4:>6} chars  {block:>10}  " + "  ".join(f"{r[key]:>{width}}" for key, width in columns))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="1000,4000,16000")
    ap.add_argument("--reps", type=int, default=200)
    args = ap.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}")
    with tempfile.TemporaryDirectory() as d:
        path = make_tokenizer(Path(d))
        tok = LocalTokenizer(path)
        table(
            "lookup, µs p50, 16 pods    block  precise tokens  approx (hash text + walk)  precise (keys + walk)  ratio"
            "  precise, kept keys  ratio  held by none: approx  precise  ratio",
            lookup_costs,
            [("tokens", 14), ("approx", 25), ("precise", 21), ("ratio", 5), ("kept", 18), ("kept_ratio", 5),
             ("new_approx", 20), ("new_precise", 7), ("new_ratio", 5)],
            tok, lengths, args.reps,
        )  # fmt: skip
        table(
            "speculation, µs p50         block  cached prefix: off  on  prediction  held by none: off  on"
            "  (pod, key) predictions held",
            speculation_costs,
            [("off", 18), ("on", 3), ("predict", 10), ("off_new", 17), ("on_new", 3), ("held", 10)],
            tok, lengths, args.reps,
        )  # fmt: skip
        with TokenizeServer(path) as server:
            http = VLLMHttpTokenizer(server.url, "m", 5.0, 30.0)
            print("token producer, ms p50     local cold  local hot  http cold  http hot")
            for n in lengths:
                loc = tokenize_costs(n, tok.encode, tok.encode_offsets, max(10, args.reps // 10))
                htp = tokenize_costs(n, http.encode, None, max(10, args.reps // 10))
                print(f"  ~{n * 4:>6} chars  {loc['cold']:>10}  {loc['hot']:>9}  {htp['cold']:>9}  {htp['hot']:>8}")
            http.close()
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}")


if __name__ == "__main__":
    main()
