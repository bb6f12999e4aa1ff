"""How fast the simulator is, so that it is never the bottleneck of a gateway benchmark.

    python -m bench.sim_throughput http      # 8 pods in one process (time-scale 0), aiohttp client at
                                             # concurrency 32 from this process, short non-streaming requests
    python -m bench.sim_throughput cluster   # 10,000 requests over 32 pods in virtual time, per baseline

`--kv-events` runs the pods with vLLM KV events on (ZMQ publishing over HTTP; in-process delivery
in the cluster simulation); `http --prompt-tokens N` sends a new N-token prompt each request, so
every request caches new blocks (and publishes them).

Only 127.0.0.1 is ever a target. Figures go to docs/BENCHMARKS.md ("Is the simulator fast enough not
to be the bottleneck?").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from ray_epp.simulator import (
    BASELINES,
    DEFAULT_MODEL,
    WorkloadSpec,
    generate_workload,
    make_pod_configs,
    run_cluster_sim,
)
from ray_epp.simulator.report import percentile

ROOT = Path(__file__).resolve().parents[1]


def start_pods(
    n: int, time_scale: float, kv_events: bool = False
) -> tuple[subprocess.Popen[str], list[dict[str, Any]]]:
    """Run `python -m ray_epp.simulator` in another process; returns it and its pod list."""
    extra = ["--kv-events"] if kv_events else []
    proc = subprocess.Popen(
        [sys.executable, "-m", "ray_epp.simulator", "--pods", str(n), "--base-port", "0",
         "--time-scale", str(time_scale), *extra],
        cwd=ROOT, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert proc.stdout is not None
    for _ in range(n):
        proc.stdout.readline()
    return proc, json.loads(proc.stdout.readline())


def _prompt(k: int, tokens: int) -> str:
    if tokens <= 0:
        return "Say hello to the simulator, please."
    head = f"request {k:012d} "
    return (head * (tokens * 4 // len(head) + 1))[: tokens * 4]


async def drive(
    urls: list[str], concurrency: int, duration: float, warmup: float, prompt_tokens: int = 0
) -> dict[str, Any]:
    body = {"model": DEFAULT_MODEL, "prompt": _prompt(0, 0), "max_tokens": 8}
    counter = iter(range(1 << 62))
    latencies: list[float] = []
    errors = 0
    connector = aiohttp.TCPConnector(limit=concurrency * 2)
    async with aiohttp.ClientSession(connector=connector) as session:
        t_start = time.perf_counter()
        t_measure, t_end = t_start + warmup, t_start + warmup + duration

        async def worker(i: int) -> None:
            nonlocal errors
            k = i
            while (now := time.perf_counter()) < t_end:
                url = urls[k % len(urls)]
                k += 1
                req = body if prompt_tokens <= 0 else {**body, "prompt": _prompt(next(counter), prompt_tokens)}
                async with session.post(url + "/v1/completions", json=req) as resp:
                    await resp.read()
                    ok = resp.status == 200
                done = time.perf_counter()
                if now >= t_measure:
                    if ok:
                        latencies.append(done - now)
                    else:
                        errors += 1

        await asyncio.gather(*(worker(i) for i in range(concurrency)))
    latencies.sort()
    return {
        "requests": len(latencies),
        "errors": errors,
        "req_per_s": len(latencies) / duration,
        "p50_ms": percentile(latencies, 50) * 1000,
        "p99_ms": percentile(latencies, 99) * 1000,
    }


def bench_http(args: argparse.Namespace) -> dict[str, Any]:
    proc, pods = start_pods(args.pods, args.time_scale, args.kv_events)
    try:
        urls = [f"http://{p['address']}:{p['port']}" for p in pods]
        result = asyncio.run(drive(urls, args.concurrency, args.duration, args.warmup, args.prompt_tokens))
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=10)
    return {
        "pods": args.pods,
        "concurrency": args.concurrency,
        "time_scale": args.time_scale,
        "kv_events": args.kv_events,
        "prompt_tokens": args.prompt_tokens,
        **result,
    }


def bench_cluster(args: argparse.Namespace) -> dict[str, Any]:
    spec = WorkloadSpec(num_requests=args.requests, rate=args.rate, prefix_groups=16, prefix_tokens=512,
                        prompt_tokens=(64, 512), output_tokens=(16, 256), seed=1)  # fmt: skip
    t0 = time.perf_counter()
    workload = generate_workload(spec)
    out: dict[str, Any] = {"requests": args.requests, "pods": args.cluster_pods, "rate": args.rate,
                           "workload_gen_s": round(time.perf_counter() - t0, 2)}  # fmt: skip
    pods = make_pod_configs(args.cluster_pods, kv_events=args.kv_events)
    out["kv_events"] = args.kv_events
    for name, cls in BASELINES.items():
        report = run_cluster_sim(pods, workload, cls(seed=0))
        out[name] = {"wall_s": round(report.wall_time_s, 2), "simulated_s": round(report.duration, 1),
                     "ttft_p50_ms": round(report.ttft.p50 * 1000, 1), "ttft_p99_ms": round(report.ttft.p99 * 1000, 1),
                     "prefix_hit_rate": round(report.prefix_hit_rate, 3)}  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    http = sub.add_parser("http", help="HTTP pods: requests per second")
    http.add_argument("--pods", type=int, default=8)
    http.add_argument("--concurrency", type=int, default=32)
    http.add_argument("--duration", type=float, default=10.0)
    http.add_argument("--warmup", type=float, default=2.0)
    http.add_argument("--time-scale", type=float, default=0.0)
    http.add_argument("--kv-events", action="store_true")
    http.add_argument("--prompt-tokens", type=int, default=0, help="0: the short fixed prompt")
    cluster = sub.add_parser("cluster", help="virtual-time cluster simulation: wall time")
    cluster.add_argument("--requests", type=int, default=10_000)
    cluster.add_argument("--cluster-pods", type=int, default=32)
    cluster.add_argument("--rate", type=float, default=200.0)
    cluster.add_argument("--kv-events", action="store_true", help="pods key blocks as vLLM and collect events")
    args = parser.parse_args(argv)
    result = bench_http(args) if args.mode == "http" else bench_cluster(args)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
