"""Precise vs approximate prefix routing vs sglang-router's cache_aware, end to end: the workloads
of bench/precise_routing.py sent over HTTP through a real router to simulated vLLM pods that publish
their KV events on ZMQ and tokenize with the bench's real tokenizer.

    python -m bench.precise_routing_e2e [--scenarios cache-pressure-shared] [--rate 0.9]
        [--capacity cache-pressure-shared=48.4] [--duration 20] [--seed 0] [--time-scale 4]

Per scenario and policy, fresh pods (`bench.e2e.E2EDriver`: a simulator process, cold caches) and a
fresh router:

* `epp-default`: `epp up` with ray_epp/configs/default.yaml (the approximate index, learning from its own
  decisions);
* `epp-precise`: `epp up` with bench/configs/precise.yaml plus a `token-producer` on the pods'
  tokenizer.json (`precise_routing.precise_config`); the pods file lists each pod's `kvEvents`
  endpoints, so the gateway's profile actors subscribe to every pod's events;
* `sglang-cache-aware`: sglang-router's `cache_aware` (needs `pip install -e .[peers]`).

On `cache-pressure-shared` a third of the requests go straight to a pod drawn at random (the pods'
Kubernetes Service, `E2EDriver.bypass`), never through the router; as in the cluster simulation,
the table's rows are the router's requests and the direct clients' figures are printed beside
them. Times are model times (wall / the time scale). The index's "predicted right" of the cluster
simulation is not measured here: it lives inside the gateway's actors."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

from bench.e2e import E2EDriver
from bench.metrics import Outcome, summarize
from bench.precise_routing import PRECISE, capacity_of, precise_config, scenarios
from bench.workloads.shared_pool import is_direct

POLICIES = ("epp-default", PRECISE, "sglang-cache-aware")


def run(
    scenario_name: str,
    rate_x: float,
    capacity: float,
    duration: float,
    seed: int,
    time_scale: float,
    policies: tuple[str, ...] = POLICIES,
) -> list[dict[str, Any]]:
    scenario = scenarios()[scenario_name]
    scenario.duration_s = duration
    rate = rate_x * capacity
    pods = [p.model_copy(update={"kv_events": True}) for p in scenario.pods()]
    tokenizer = pods[0].tokenizer
    requests = sorted(scenario.run_workload(rate, seed), key=lambda r: r.arrival_time)
    direct = {r.request_id for r in requests if is_direct(r)}
    driver = E2EDriver(time_scale=time_scale, max_requests=len(requests), bypass=is_direct if direct else None)
    rows = []
    with tempfile.TemporaryDirectory(prefix="epp-precise-e2e-") as td:
        for policy in policies:
            target = policy
            if policy.startswith(PRECISE) and tokenizer:
                path = Path(td) / f"{policy}.yaml"
                path.write_text(yaml.safe_dump(precise_config(tokenizer, policy), sort_keys=False))
                target = f"epp:{path}"
            result = driver.run(target, pods, requests, seed)
            routed = [o for o in result.outcomes if o.request_id not in direct]
            bypassed = [o for o in result.outcomes if o.request_id in direct]
            rows.append(
                {
                    "scenario": scenario_name,
                    "policy": policy,
                    "rate": round(rate, 1),
                    "seed": seed,
                    "time_scale": time_scale,
                    "load_average": os.getloadavg()[0],
                    "routed": _figures(routed),
                    "direct": _figures(bypassed) if bypassed else None,
                    "errors": result.extra.get("errors"),
                }
            )
    return rows


def _figures(outcomes: list[Outcome]) -> dict[str, Any]:
    m = summarize(outcomes)
    keep = ("requests", "completed", "shed", "errors", "ttft_ms", "e2e_ms", "output_throughput", "prefix_hit_rate")
    return {k: m[k] for k in keep}


def _row(name: str, r: dict[str, Any], part: str) -> str:
    f = r[part]
    t = f["ttft_ms"]
    return (
        f"| {r['scenario']} | {name} | {f['completed']}/{f['requests']} | {t['p50']:.0f} | {t['p90']:.0f} | "
        f"{t['p99']:.0f} | {f['output_throughput']:.0f} | {f['prefix_hit_rate']:.2f} |"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenarios", default="cache-pressure-shared")
    ap.add_argument("--rate", type=float, default=0.9)
    ap.add_argument("--capacity", default="", help="name=req/s,...: as bench.precise_routing's")
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--time-scale", type=float, default=4.0)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    given = {k: float(v) for k, v in (kv.split("=") for kv in args.capacity.split(",") if kv)}
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    head = "| scenario | policy | done | TTFT p50 ms | p90 ms | p99 ms | output tok/s | prefix hit |\n"
    head += "|---" * 8 + "|"
    rows: list[dict[str, Any]] = []
    for name in args.scenarios.split(","):
        capacity = capacity_of(name, given, args.seed)
        print(f"{name}: capacity {capacity:.1f} req/s (round-robin), rate {args.rate}x", flush=True)
        policies = tuple(args.policies.split(","))
        rows += run(name, args.rate, capacity, args.duration, args.seed, args.time_scale, policies)
    print(head)
    for r in rows:
        print(_row(r["policy"], r, "routed"))
        if r["errors"]:
            print(f"  errors: {json.dumps(r['errors'])[:600]}")
    if any(r["direct"] for r in rows):
        print("\ndirect clients (bypassing the router) in the same runs:")
        print(head.replace("| policy |", "| router |"))
        for r in rows:
            if r["direct"]:
                print(_row(r["policy"], r, "direct"))
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
