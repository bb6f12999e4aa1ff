"""What precise prefix routing costs per request, against the approximate index at the same prompt
lengths: the lookup (block keys + the index walk, with a pod holding the whole prompt among 16
pods), and the token producer's added latency, cold (a new prefix) and hot (a cached prefix, a new
rest), for a local tokenizer.json and for vLLM's /tokenize over HTTP on 127.0.0.1 (a real server
with the same tokenizer). Tokens per character follow the bench tokenizer (a small BPE: more tokens
per character than a real model's, so token counts are upper bounds for the lengths given).

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
    """Both indexes with `block`-token blocks (the approximate one's are 4 characters a token)."""
    rng = random.Random(length)
    text = text_of(length, rng)
    ids = tok.encode(text, True)
    approx, precise = PrefixIndex(), PreciseIndex(block, default_capacity=100_000)
    for p in range(PODS):  # every pod holds some other prompt; pod 0 holds this one too
        other = text_of(length, rng)
        approx.add(hash_prompt(other, "m", block, 2048), f"pod-{p}")
        precise.blocks.add(precise.keys(tok.encode(other, True)), f"pod-{p}", 100_000)
    approx.add(hash_prompt(text, "m", block, 2048), "pod-0")
    precise.blocks.add(precise.keys(ids), "pod-0", 100_000)
    a, pr = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        approx.match(hash_prompt(text, "m", block, 131072 // block))
        t1 = time.perf_counter()
        precise.match(precise.keys(ids, 131072 // block))
        t2 = time.perf_counter()
        a.append(t1 - t0)
        pr.append(t2 - t1)
    return {
        "tokens": str(len(ids)),
        "approx": us(a),
        "precise": us(pr),
        "ratio": f"{statistics.median(pr) / statistics.median(a):.2f}",
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
        )
        for block in (16, 64):
            for n in lengths:
                r = lookup_costs(n, tok, args.reps, block)
                print(
                    f"  ~{n * 4:>6} chars  {block:>10}  {r['tokens']:>14}  {r['approx']:>25}  {r['precise']:>21}  "
                    f"{r['ratio']:>5}"
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
