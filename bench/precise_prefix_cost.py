"""What precise prefix routing costs per request, against the approximate index at the same prompt
lengths: the lookup (block keys + the index walk, with a pod holding the whole prompt among 16
pods; the precise keys from the tokens alone, and with the shared prefix's keys kept on the token
cache's run, as the token producer hands them over; and a prompt no pod holds, where the precise
walk stops after one block), and the token producer's added latency, cold
(a new prefix) and hot (a cached prefix, a new rest), for a local tokenizer.json and for vLLM's
/tokenize over HTTP on 127.0.0.1 (a real server with the same tokenizer). Tokens per character
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
        print(
            "lookup, µs p50, 16 pods    block  precise tokens  approx (hash text + walk)  precise (keys + walk)  ratio"
            "  precise, kept keys  ratio  held by none: approx  precise  ratio"
        )
        for block in (16, 64):
            for n in lengths:
                r = lookup_costs(n, tok, args.reps, block)
                print(
                    f"  ~{n * 4:>6} chars  {block:>10}  {r['tokens']:>14}  {r['approx']:>25}  {r['precise']:>21}  "
                    f"{r['ratio']:>5}  {r['kept']:>18}  {r['kept_ratio']:>5}  {r['new_approx']:>20}  "
                    f"{r['new_precise']:>7}  {r['new_ratio']:>5}"
                )
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
