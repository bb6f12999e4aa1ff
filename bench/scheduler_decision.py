"""How long one scheduling decision takes: `Scheduler.schedule` with Ray EPP's default config
(ray_epp/configs/default.yaml: queue-scorer 2, kv-cache-utilization-scorer 2, prefix-cache-scorer 3,
prefill-eta-scorer 4, prefix-home-balance-scorer 2) or any other (`--config`, e.g.
ray_epp/configs/gie-default.yaml) for 8 KB prompts, at several pool sizes.

    .venv/bin/python -m bench.scheduler_decision [--endpoints 8,64,512] [--decisions 3000] [--config F]

Each request is a fresh LLMRequest (nothing memoised) whose prompt is one of 64 shared prefixes
(6 KB) plus a unique 2 KB tail, so the prefix index holds real content and most requests match a
prefix on a few pods. Endpoints have varied queue, running and KV-cache metrics; after every
decision (untimed) the chosen pod gets busier and one random pod gets fresh metrics, as scrapes would
show, so load moves and prefixes spread over many pods. Timed per decision with perf_counter_ns:

* decision — `schedule(..., run_pre_request=False)`: filters, the three scorers, the picker;
* pre-request — the prefix index learning the decision (`Scheduler.pre_request`);
* total — both, which is what `Scheduler.schedule` costs by default.

A second pass with a plugin timer gives each plugin's share (the timer adds a call per plugin);
hashing alone is timed on its own. Each size runs --rounds times with fresh state (the machine is
shared: the round with the lowest total p50 is shown, with every round's total). Results go to
stdout as a Markdown table (and to --json if given)."""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from pathlib import Path

from bench.workloads.common import random_words
from scheduler import (
    Endpoint,
    EndpointPickerConfig,
    LLMRequest,
    Metrics,
    Scheduler,
    dump_config,
    load_config,
    load_config_file,
)
from scheduler.plugins.producers.approx_prefix import ApproxPrefixCacheProducer
from scheduler.plugins.support.prefix import PREFIX_MATCH_KEY, prefix_block_hashes
from serve_app.cli.launch import DEFAULT_CONFIG

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
# A 64-word made-up vocabulary: prompts look like text (spaces, varied word lengths), cost nothing to build.
WORDS = [
    a + b
    for a in ("ka", "lo", "mi", "ne", "su", "ta", "ri", "po")
    for b in ("n", "ra", "lin", "to", "s", "me", "da", "x")
]


def text(rng: random.Random, size: int) -> str:
    return random_words(rng, WORDS, size)


def make_endpoints(n: int, rng: random.Random) -> list[Endpoint]:
    return [
        Endpoint(
            name=f"pod-{i:03d}",
            address=f"10.0.{i // 250}.{i % 250 + 1}",
            port=8000,
            labels={"app": "vllm-llama3-8b"},
            metrics=randomise(Metrics(cache_block_size=16, cache_num_blocks=31250, max_active_models=4), rng),
        )
        for i in range(n)
    ]


def randomise(m: Metrics, rng: random.Random) -> Metrics:
    m.waiting_queue_size = int(rng.expovariate(1 / 4))
    m.running_requests_size = rng.randint(0, 48)
    m.kv_cache_usage_percent = round(rng.uniform(0.05, 0.95), 3)
    m.update_time = time.time()
    return m


class Workload:
    """8 KB prompts: one of `groups` shared prefixes (`shared_fraction`, 3/4, of the prompt) and a
    unique tail (none at fraction 1: every prompt repeats one of the prefixes whole)."""

    def __init__(self, rng: random.Random, prompt_bytes: int, groups: int, shared_fraction: float = 0.75) -> None:
        self.rng = rng
        self.prompt_bytes = prompt_bytes
        self.shared = int(prompt_bytes * shared_fraction)
        self.prefixes = [f"[system {g}] " + text(rng, self.shared) for g in range(groups)]
        self.count = 0

    def requests(self, count: int) -> Iterator[LLMRequest]:
        """Made one at a time and dropped after use, as a server sees them."""
        for _ in range(count):
            self.count += 1
            prompt = self.rng.choice(self.prefixes) + text(self.rng, self.prompt_bytes - self.shared)
            body = {"model": MODEL, "prompt": prompt[: self.prompt_bytes], "max_tokens": 128}
            yield LLMRequest(request_id=f"r{self.count}", target_model=MODEL, body=body)


# plugins that read the prefix scorer's match data and so cannot run without it
NEEDS_PREFIX_DATA = {
    "approx-prefix-cache-producer",
    "gie-prefix-cache-producer",  # the combined scorer's, as the loader expands it
    "prefix-cache-scorer",
    "prefix-home-balance-scorer",
    "no-hit-lru-scorer",
    "candidate-subset-filter",
    "prefix-cache-affinity-filter",
}


def without_prefix_scorer(config: EndpointPickerConfig) -> EndpointPickerConfig:
    """The baseline: the config without prefix-cache-scorer and the scorers that need its data."""
    data = dump_config(config)
    dropped = {p.get("name") or p["type"] for p in data["plugins"] if p["type"] in NEEDS_PREFIX_DATA}
    data["plugins"] = [p for p in data["plugins"] if p["type"] not in NEEDS_PREFIX_DATA]
    for profile in data["schedulingProfiles"]:
        profile["plugins"] = [r for r in profile["plugins"] if r["pluginRef"] not in dropped]
    return load_config(data)


def load_feedback(target: Endpoint, endpoints: list[Endpoint], rng: random.Random) -> None:
    """Between decisions (not timed): the chosen pod gets busier and another pod's scrape brings
    fresh, random metrics, so the load keeps moving and prefixes spread over many pods."""
    m = target.metrics
    m.waiting_queue_size += 1
    m.running_requests_size += 1
    m.kv_cache_usage_percent = min(0.99, m.kv_cache_usage_percent + 0.02)
    randomise(rng.choice(endpoints).metrics, rng)


def pct(values: list[int], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] / 1000.0  # ns → µs


class PluginTimes:
    def __init__(self) -> None:
        self.samples: dict[str, list[float]] = defaultdict(list)

    def __call__(self, extension_point: str, plugin, seconds: float) -> None:
        self.samples[f"{extension_point}:{plugin.type_name}"].append(seconds * 1e6)


def run(
    n_endpoints: int,
    decisions: int,
    warmup: int,
    prompt_bytes: int,
    groups: int,
    seed: int,
    freeze: bool = False,
    config_path: str | Path = DEFAULT_CONFIG,
    respond: bool = False,
) -> dict:
    rng = random.Random(seed)
    endpoints = make_endpoints(n_endpoints, rng)
    workload = Workload(rng, prompt_bytes, groups)
    config = load_config_file(config_path)
    clock = time.perf_counter_ns
    cpu = time.thread_time_ns  # CPU time: what a decision costs when other processes take the cores

    def one_pass(sched: Scheduler, reqs: Iterable[LLMRequest]) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {"decision": [], "pre": [], "total": [], "cpu": [], "hit": []}
        for req in reqs:
            c0 = cpu()
            t0 = clock()
            result = sched.schedule(req, endpoints, run_pre_request=False)
            t1 = clock()
            sched.pre_request(req, result)
            t2 = clock()
            out["cpu"].append(cpu() - c0)
            out["decision"].append(t1 - t0)
            out["pre"].append(t2 - t1)
            out["total"].append(t2 - t0)
            info = result.target.attributes.get(PREFIX_MATCH_KEY)
            out["hit"].append(int(info is not None and info.match_blocks > 0))
            if respond:  # untimed: plugins that learn from responses (the latency predictor) get warm
                sched.response_first_token(req, result.target.name)
                sched.response_complete(req, result.target.name)
            load_feedback(result.target, endpoints, rng)
        return out

    # the headline pass: no plugin timer
    sched = Scheduler.from_config(config)
    one_pass(sched, workload.requests(warmup))
    if freeze:  # what a long-running server can do once started: full collections skip what exists now
        gc.collect()
        gc.freeze()
    main = one_pass(sched, workload.requests(decisions))
    prefix = next(p for p in sched.plugins.values() if isinstance(p, ApproxPrefixCacheProducer))

    # the breakdown pass: the same, with a plugin timer (which adds a call per plugin)
    timer = PluginTimes()
    timed = Scheduler.from_config(config, timer=timer)
    one_pass(timed, workload.requests(warmup))
    timer.samples.clear()
    one_pass(timed, workload.requests(decisions))

    # the baseline: the same traffic and config without prefix-cache-scorer
    baseline_sched = Scheduler.from_config(without_prefix_scorer(config))
    one_pass(baseline_sched, workload.requests(warmup))
    baseline = one_pass(baseline_sched, workload.requests(decisions))

    hashing = []
    for req in workload.requests(500):
        t0 = clock()
        prefix_block_hashes(req, 16, 256)
        hashing.append(clock() - t0)

    return {
        "endpoints": n_endpoints,
        "decisions": decisions,
        "decision_p50_us": pct(main["decision"], 0.50),
        "decision_p99_us": pct(main["decision"], 0.99),
        "pre_request_p50_us": pct(main["pre"], 0.50),
        "total_p50_us": pct(main["total"], 0.50),
        "total_p99_us": pct(main["total"], 0.99),
        "total_cpu_p50_us": pct(main["cpu"], 0.50),
        "without_prefix_p50_us": pct(baseline["total"], 0.50),
        "total_cpu_p99_us": pct(main["cpu"], 0.99),
        "plugin_p50_us": {k: round(statistics.median(v), 1) for k, v in sorted(timer.samples.items())},
        "hashing_p50_us": pct(hashing, 0.50),
        "index_blocks": len(prefix.index),
        "index_servers": len(prefix.index.servers()),
        "prefix_hit_pct": 100.0 * sum(main["hit"]) / len(main["hit"]),
    }


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()} ({sys.implementation.name})"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--endpoints", default="8,64,512", help="comma-separated pool sizes")
    ap.add_argument("--decisions", type=int, default=3000)
    ap.add_argument("--warmup", type=int, default=1000)
    ap.add_argument(
        "--respond",
        action="store_true",
        help="report each decision's first token and completion at once (untimed), so plugins that learn "
        "from responses (predicted-latency-producer) are warm; in-flight ledgers then stay empty",
    )
    ap.add_argument("--prompt-bytes", type=int, default=8192)
    ap.add_argument("--groups", type=int, default=64, help="shared-prefix groups")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3, help="runs per size; the one with the lowest total p50 is shown")
    ap.add_argument("--gc-freeze", action="store_true", help="gc.freeze() after the warm-up")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--config", default=DEFAULT_CONFIG, help="the EndpointPickerConfig to time")
    args = ap.parse_args(argv)

    rows = []
    for n in args.endpoints.split(","):
        rounds = [
            run(
                int(n),
                args.decisions,
                args.warmup,
                args.prompt_bytes,
                args.groups,
                args.seed + i,
                args.gc_freeze,
                args.config,
                args.respond,
            )
            for i in range(args.rounds)
        ]
        best = min(rounds, key=lambda r: r["total_p50_us"])
        best["rounds_total_p50_us"] = [r["total_p50_us"] for r in rounds]
        rows.append(best)
    print(f"machine: {machine()}; load average during the run {os.getloadavg()[0]:.2f}")
    print(
        f"{args.decisions} decisions per size after {args.warmup} warm-up, {args.prompt_bytes} B prompts, "
        f"{args.groups} shared-prefix groups, {args.config}{', responses reported' if args.respond else ''}; "
        f"best of {args.rounds} rounds\n"
    )
    print(
        "| endpoints | decision p50 | decision p99 | + pre-request p50 | total p50 | total p99 | total CPU p50 / p99 "
        "| prefix score p50 | of which hashing | queue | kv-cache | picker | rest (framework) | prefix hit "
        "| without prefix-cache-scorer: total p50 |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        s = r["plugin_p50_us"]
        plugins = [
            s.get(k, 0.0)
            for k in ("Scorer:prefix-cache-scorer", "Scorer:queue-scorer", "Scorer:kv-cache-utilization-scorer")
        ]
        picker = s.get("Picker:max-score-picker", 0.0)
        rest = max(0.0, r["decision_p50_us"] - sum(plugins) - picker)
        print(
            f"| {r['endpoints']} | {r['decision_p50_us']:.0f} µs | {r['decision_p99_us']:.0f} µs "
            f"| {r['pre_request_p50_us']:.0f} µs | {r['total_p50_us']:.0f} µs | {r['total_p99_us']:.0f} µs "
            f"| {r['total_cpu_p50_us']:.0f} / {r['total_cpu_p99_us']:.0f} µs "
            f"| {plugins[0]:.0f} µs | {r['hashing_p50_us']:.0f} µs | {plugins[1]:.0f} µs | {plugins[2]:.0f} µs "
            f"| {picker:.0f} µs | ~{rest:.0f} µs | {r['prefix_hit_pct']:.0f}% | {r['without_prefix_p50_us']:.0f} µs |"
        )
    print(
        "\ntotal p50 of each round (µs): "
        + "; ".join(f"{r['endpoints']}: {', '.join(f'{v:.0f}' for v in r['rounds_total_p50_us'])}" for r in rows)
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "machine": machine(),
                    "args": vars(args) | {"json": str(args.json), "config": str(args.config)},
                    "results": rows,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
