"""Routing quality with candidate subsetting in a large pool: Ray EPP's default against the same
config behind `candidate-subset-filter` (bench/configs/default-subset.yaml: the scorers see at most
32 endpoints), in the cluster simulation, on the same arrivals.

    python -m bench.candidate_subset [--pods 256] [--rate-per-pod 11.1] [--duration 10] [--seeds 0,1,2]

The workload is SGLang's shared prefix (2,048-token system prompts, 128-token questions, 256
output tokens) with the groups scaled to the pool (64 per 8 pods), at 0.9x of the per-pod capacity
the 8-pod calibration measured (`epp bench shared-prefix`: 98.3 req/s for 8 pods, so 11.1 req/s a
pod at 0.9x). Prints TTFT p50/p90/p99, output tokens/s, the prefix hit rate and the router's wall
time per decision in this process, per seed and policy."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import replace

from bench.policies import make_policy
from bench.workloads import SGLANG_GSP, shared_prefix_workload
from ray_epp.simulator import ClusterSim, make_pod_configs

POLICIES = ("epp-default", "epp-default-subset")


def run(pods: int, rate: float, duration: float, seed: int, policy: str) -> dict[str, float]:
    spec = replace(SGLANG_GSP, groups=SGLANG_GSP.groups * pods // 8)
    workload = shared_prefix_workload(spec, rate, seed, int(rate * duration))
    router = make_policy(policy, seed=seed)
    sim = ClusterSim(make_pod_configs(pods), router, seed=seed)
    started = time.process_time()
    report = sim.run(workload)
    cpu = time.process_time() - started
    return {
        "ttft_p50_ms": report.ttft.p50 * 1e3,
        "ttft_p90_ms": report.ttft.p90 * 1e3,
        "ttft_p99_ms": report.ttft.p99 * 1e3,
        "output_tok_s": report.output_token_throughput,
        "prefix_hit": report.prefix_hit_rate,
        "requests": len(workload),
        "cpu_s_per_request_ms": cpu / len(workload) * 1e3,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--pods", type=int, default=256)
    ap.add_argument("--rate-per-pod", type=float, default=11.1)
    ap.add_argument("--duration", type=float, default=10.0, help="seconds of arrivals (virtual time)")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    rate = args.rate_per_pod * args.pods
    print(f"load average {os.getloadavg()[0]:.2f}; {args.pods} pods, {rate:.0f} req/s, {args.duration:g} s")
    print("| seed | policy | TTFT p50 ms | p90 ms | p99 ms | output tok/s | prefix hit | sim CPU per request ms |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    rows = []
    for seed in map(int, args.seeds.split(",")):
        for policy in POLICIES:
            r = run(args.pods, rate, args.duration, seed, policy)
            rows.append({"seed": seed, "policy": policy, **r})
            print(
                f"| {seed} | {policy} | {r['ttft_p50_ms']:.1f} | {r['ttft_p90_ms']:.1f} | {r['ttft_p99_ms']:.1f} | "
                f"{r['output_tok_s']:,.0f} | {r['prefix_hit']:.3f} | {r['cpu_s_per_request_ms']:.2f} |",
                flush=True,
            )
    for policy in POLICIES[1:]:
        ratios = [
            b["ttft_p90_ms"] / a["ttft_p90_ms"]
            for a, b in zip(rows[0::2], rows[1::2], strict=True)
            if a["policy"] == POLICIES[0] and b["policy"] == policy
        ]
        print(f"\n{policy} / {POLICIES[0]} TTFT p90: mean {statistics.mean(ratios):.3f} over {len(ratios)} seeds")
    print(f"load average {os.getloadavg()[0]:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
