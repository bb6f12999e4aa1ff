"""Precise vs approximate prefix routing vs sglang-router's cache_aware, in the cluster simulation:
one run per scenario and policy at one rate, side by side. The simulated pods publish their KV
events (kvevents, in virtual time) to the precise policy; every policy sees the same requests.

    python -m bench.precise_routing [--scenarios shared-prefix,shared-prefix-llmd,cache-pressure]
        [--rate 0.9] [--capacity shared-prefix=152.8,...] [--duration 20] [--seed 0]

`--rate` is a fraction of the scenario's capacity (round-robin's, from `--capacity` or the last
`epp bench` result in bench/results, else calibrated). Prints TTFT p50/p90/p99, throughput, prefix
hit rate, and how often each index's predicted cached tokens for the chosen pod were right (within
one block of what the pod served from its cache; cache_aware predicts no token count), over all
requests and over those where the prediction or the pod's cache hit was not zero."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from bench.policies import make_policy
from bench.runner import calibrate
from bench.scenarios import build_scenarios
from simulator import ClusterSim

POLICIES = ("epp-default", "epp-precise", "sglang-cache-aware")
RESULTS = Path(__file__).parent / "results"


def capacity_of(name: str, given: dict[str, float], seed: int) -> float:
    if name in given:
        return given[name]
    path = RESULTS / f"{name}.json"
    if path.is_file():
        return float(json.loads(path.read_text())["capacity"]["request_rate"])
    return float(calibrate(build_scenarios()[name], seed=seed)["request_rate"])


def run(scenario_name: str, rate_x: float, capacity: float, duration: float, seed: int) -> list[dict]:
    scenario = build_scenarios()[scenario_name]
    scenario.duration_s = duration
    rate = rate_x * capacity
    rows = []
    for policy in POLICIES:
        requests = scenario.run_workload(rate, seed)  # the same seed: the same requests for every policy
        router = make_policy(policy, seed)
        report = ClusterSim(scenario.pods(), router, seed=seed).run(requests)
        pred = getattr(router, "predictions", None)
        rows.append(
            {
                "scenario": scenario_name,
                "policy": policy,
                "rate": round(rate, 1),
                "requests": len(requests),
                "ttft_p50": report.ttft.p50,
                "ttft_p90": report.ttft.p90,
                "ttft_p99": report.ttft.p99,
                "throughput": report.output_token_throughput,
                "hit_rate": report.prefix_hit_rate,
                "predicted_right": (pred["right"] / pred["total"]) if pred and pred["total"] else None,
                "predicted_right_cached": (pred["right_cached"] / pred["total_cached"])
                if pred and pred["total_cached"]
                else None,
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenarios", default="shared-prefix,shared-prefix-llmd,cache-pressure")
    ap.add_argument("--rate", type=float, default=0.9)
    ap.add_argument("--capacity", default="")
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    given = {k: float(v) for k, v in (kv.split("=") for kv in args.capacity.split(",") if kv)}
    known = build_scenarios()
    print(f"load average {os.getloadavg()[0]:.2f}")
    print(
        "| scenario | policy | req/s | TTFT p50 s | p90 s | p99 s | output tok/s | prefix hit | predicted right "
        "| right where cached |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in args.scenarios.split(","):
        if name not in known:
            print(f"| {name} | (no such scenario here) |")
            continue
        for r in run(name, args.rate, capacity_of(name, given, args.seed), args.duration, args.seed):
            right = "n/a" if r["predicted_right"] is None else f"{r['predicted_right']:.2f}"
            cached = "n/a" if r["predicted_right_cached"] is None else f"{r['predicted_right_cached']:.2f}"
            print(
                f"| {r['scenario']} | {r['policy']} | {r['rate']} | {r['ttft_p50']:.3f} | {r['ttft_p90']:.3f} | "
                f"{r['ttft_p99']:.3f} | {r['throughput']:.0f} | {r['hit_rate']:.2f} | {right} | {cached} |",
                flush=True,
            )
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
