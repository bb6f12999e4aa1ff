"""Flow control (a queue) against shed-only admission (429 at once), in the cluster simulation.

The workload: unique prompts of 128-1,024 tokens, 16-256 output tokens (the overload scenario's
requests), Poisson arrivals at a fraction of the pool's capacity, each request independently
(seeded) critical (priority 1, 20 %) or sheddable (priority -1) from one of two tenants
(`x-gateway-inference-fairness-id`): `flood` sends 5x as much as `steady` (`--critical-share`
0.5 is the overload scenario's half-and-half mix). The same requests
for every config at a given load.

Per run, in the steady state (the window from `WARMUP_S` after the first arrival to the last
arrival): critical TTFT p90 of the critical requests that arrived in it (and its ratio to the same
config's value at 0.5x); sheddable goodput, sheddable requests completed per second of the window
(by completion time: what the pool delivers while the load lasts, whatever a queue holds at the
edges); the sheddable TTFT p90 of those; and Jain's fairness index between the tenants' goodput,
each normalised by its max-min fair share of what was served (a tenant asking for less than an
equal share is owed all it asked): 1.0 when each got its fair share.

    .venv/bin/python -m bench.flow_control                       # 0.5x, 1.5x, 3x; 20 s per rung
    .venv/bin/python -m bench.flow_control --loads 1.5 --duration 10 --json out.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench.policies.epp import SchedulerRouter
from bench.workloads import uniform_spec
from bench.workloads.synthetic import random_prompt_workload
from ray_epp.simulator import SimRequest, make_pod_configs, run_cluster_sim
from ray_epp.simulator.report import OK, percentile
from scheduler import EndpointPickerConfig, load_config
from scheduler.flowcontrol.types import FAIRNESS_ID_HEADER, Outcome

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {
    "shed-only (ray_epp/configs/default.yaml)": ROOT / "ray_epp/configs/default.yaml",
    "shed-only (ray_epp/configs/priority.yaml)": ROOT / "ray_epp/configs/priority.yaml",
    "flow control, round-robin (bench/configs/flow-control.yaml)": ROOT / "bench/configs/flow-control.yaml",
    "flow control, global-strict (bench/configs/flow-control-strict.yaml)": ROOT
    / "bench/configs/flow-control-strict.yaml",
    "flow control, holdback (bench/configs/flow-control-holdback.yaml)": ROOT
    / "bench/configs/flow-control-holdback.yaml",
    "flow control, soft ceiling (bench/configs/flow-control-soft-ceiling.yaml)": ROOT
    / "bench/configs/flow-control-soft-ceiling.yaml",
}
BASELINE = "shed-only (ray_epp/configs/priority.yaml)"  # goodput ratios are to this one, as written
CAPACITY = 229.7  # req/s, 8 pods, this workload: docs/BENCHMARKS.md "Priority under overload"
CRITICAL_SHARE = 0.2
FLOOD_RATIO = 5.0
TENANTS = ("flood", "steady")
WARMUP_S = 5.0  # a few request lifetimes plus the queue's 2 s TTL


@dataclass(slots=True)
class Labelled:
    requests: list[SimRequest]
    kind: dict[str, str]  # request id -> "critical" | tenant


def workload(rate: float, duration: float, seed: int, critical_share: float = CRITICAL_SHARE) -> Labelled:
    n = max(200, math.ceil(rate * duration))
    reqs = random_prompt_workload(uniform_spec(n), rate, seed)
    rng = random.Random(f"{seed}:tenants")
    kind: dict[str, str] = {}
    flood_share = (1 - critical_share) * FLOOD_RATIO / (FLOOD_RATIO + 1)
    for r in reqs:
        u = rng.random()
        if u < critical_share:
            r.priority, k = 1, "critical"
        else:
            r.priority, k = -1, "flood" if u < critical_share + flood_share else "steady"
            r.headers[FAIRNESS_ID_HEADER] = k
        kind[r.request_id] = k
    return Labelled(reqs, kind)


def jain(values: list[float]) -> float:
    total, squares = sum(values), sum(v * v for v in values)
    return total * total / (len(values) * squares) if squares > 0 else 1.0


def max_min_shares(served_total: float, demands: dict[str, float]) -> dict[str, float]:
    """Water-filling: each tenant gets min(its demand, an equal split of what is left)."""
    shares: dict[str, float] = {}
    left, open_ = served_total, sorted(demands, key=demands.get)
    while open_:
        equal = left / len(open_)
        t = open_.pop(0)
        shares[t] = min(demands[t], equal)
        left -= shares[t]
    return shares


def with_line(path: Path, tokens: int | None, ttl: str | None = None) -> Path | EndpointPickerConfig:
    """The config with its prefill-backlog-detector's maxBacklogTokens set and, for a flow-control
    config, its defaultRequestTTL (None: as written)."""
    data = yaml.safe_load(path.read_text())
    found = False
    for spec in data["plugins"]:
        if tokens is not None and spec["type"] == "prefill-backlog-detector":
            spec.setdefault("parameters", {})["maxBacklogTokens"] = tokens
            found = True
    if ttl is not None and "flowControl" in data:
        data["flowControl"]["defaultRequestTTL"] = ttl
        found = True
    return load_config(data) if found else path


def run_one(
    config: Path | EndpointPickerConfig, load: float, labelled: Labelled, duration: float, seed: int
) -> dict[str, Any]:
    router = SchedulerRouter(config, seed=seed)
    t0 = time.perf_counter()
    report = run_cluster_sim(make_pod_configs(8), labelled.requests, router, seed=seed)
    wall = time.perf_counter() - t0
    outcomes: dict[str, int] = {}
    for o in router.flow_outcomes.values():
        outcomes[o.value] = outcomes.get(o.value, 0) + 1
    return {
        "load": load,
        **steady_state(report.results, labelled),
        "queue_outcomes": outcomes,
        "rejected_capacity": outcomes.get(Outcome.REJECTED_CAPACITY.value, 0),
        "wall_s": wall,
    }


def steady_state(results: list[Any], labelled: Labelled) -> dict[str, Any]:
    """The figures of one run from its per-request results (anything with request_id, status,
    arrival, ttft and e2e in the workload's time: the simulator's or the end-to-end client's)."""
    start = min(r.arrival_time for r in labelled.requests) + WARMUP_S
    end = max(r.arrival_time for r in labelled.requests)
    span = end - start
    arrived: dict[str, list] = {"critical": [], "flood": [], "steady": []}  # arrived in the window
    done: dict[str, list] = {"critical": [], "flood": [], "steady": []}  # completed in the window
    for res in results:
        kind = labelled.kind[res.request_id]
        if start <= res.arrival <= end:
            arrived[kind].append(res)
        if res.status == OK and start <= res.arrival + res.e2e <= end:
            done[kind].append(res)
    crit_ttft = sorted(r.ttft for r in arrived["critical"] if r.status == OK)
    shed_ok = [r for t in TENANTS for r in done[t]]
    served = {t: len(done[t]) for t in TENANTS}
    demand = {t: float(len(arrived[t])) for t in TENANTS}
    fair = max_min_shares(sum(served.values()), demand)
    normalised = [served[t] / fair[t] if fair[t] > 0 else 1.0 for t in TENANTS]
    return {
        "requests": len(labelled.requests),
        "critical_done": f"{len(crit_ttft)}/{len(arrived['critical'])}",
        "critical_ttft_p90_ms": 1000 * percentile(crit_ttft, 90) if crit_ttft else math.nan,
        "sheddable_goodput_rps": len(shed_ok) / span,
        "sheddable_served": served,
        "sheddable_offered": {t: len(arrived[t]) for t in TENANTS},
        "sheddable_ttft_p90_ms": 1000 * percentile(sorted(r.ttft for r in shed_ok), 90) if shed_ok else math.nan,
        "jain": jain(normalised),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--capacity", type=float, default=CAPACITY, help="the pool's capacity in req/s")
    ap.add_argument("--loads", default="0.5,1.5,3", help="fractions of capacity")
    ap.add_argument("--duration", type=float, default=20.0, help="seconds of arrivals per rung")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--critical-share", type=float, default=CRITICAL_SHARE, help="share of requests that are critical")
    ap.add_argument("--only", default="", help="run only configs whose label contains one of these (comma-separated)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument(
        "--lines", default="", help="comma-separated maxBacklogTokens for the prefill-backlog-detector (a sweep)"
    )
    ap.add_argument("--ttl", default=None, help="the flow-control configs' defaultRequestTTL, e.g. 5s (0s: none)")
    args = ap.parse_args(argv)
    loads = [float(x) for x in args.loads.split(",")]
    lines: list[int | None] = [int(x) for x in args.lines.split(",")] if args.lines else [None]
    if 0.5 not in loads:
        loads.insert(0, 0.5)  # the reference for the critical TTFT target
    print(f"load average at start: {os.getloadavg()}")
    rows: list[dict[str, Any]] = []
    for load in loads:
        labelled = workload(load * args.capacity, args.duration, args.seed, args.critical_share)
        for label, path in CONFIGS.items():
            if args.only and not any(part in label for part in args.only.split(",")):
                continue
            for line in lines:
                config = with_line(path, line, args.ttl)
                name = (
                    label
                    if config is path
                    else label
                    + (f", line {line}" if line else "")
                    + (f", TTL {args.ttl}" if args.ttl and "flowControl" in yaml.safe_load(path.read_text()) else "")
                )
                row = {"config": name, **run_one(config, load, labelled, args.duration, args.seed)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    base = {r["config"]: r["critical_ttft_p90_ms"] for r in rows if r["load"] == 0.5}
    shed_only = {r["load"]: r["sheddable_goodput_rps"] for r in rows if r["config"] == BASELINE}
    print(f"\nload average at end: {os.getloadavg()}\n")
    print("| config | load | critical TTFT p90 ms (x 0.5x) | sheddable goodput req/s (x shed-only) "
          "| sheddable TTFT p90 ms | served flood / steady (offered) | Jain |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        ratio = r["critical_ttft_p90_ms"] / base[r["config"]] if base.get(r["config"]) else math.nan
        g = shed_only.get(r["load"])
        gx = r["sheddable_goodput_rps"] / g if g else math.nan
        s, o = r["sheddable_served"], r["sheddable_offered"]
        print(
            f"| {r['config']} | {r['load']:g}x | {r['critical_ttft_p90_ms']:.0f} ({ratio:.2f}x) "
            f"| {r['sheddable_goodput_rps']:.1f} ({gx:.2f}x) | {r['sheddable_ttft_p90_ms']:.0f} "
            f"| {s['flood']} / {s['steady']} ({o['flood']} / {o['steady']}) | {r['jain']:.3f} |"
        )
    if args.json is not None:
        meta = {"capacity": args.capacity, "seed": args.seed, "critical_share": args.critical_share}
        args.json.write_text(json.dumps({**meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
