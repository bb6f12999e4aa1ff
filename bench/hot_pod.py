"""Agentic sessions on a pool where one pod is also loaded by clients the router does not see: what
a sticky filter's gate misses, and what the scraped-saturation escape is for.

The router under test gets the agentic scenario's sessions at a fraction of the pool's capacity.
Beside them, a client sends unique prompts (the uniform scenario's) straight to one pod at
`--direct-rate` requests/s: a batch job wired to one pod's address, a second gateway that
prefers it. The router never hears of those requests (bench.policies.service_bypass, pinned to
that pod); it sees their load only in that pod's scraped queue and KV use. A sticky filter whose
gate counts only the router's own in-flight tokens keeps sending that pod the turns whose
conversation it holds; the escape (`saturationConditions`) ends the claim once the scraped queue
is over its line. Figures are over the router's requests.

    python -m bench.hot_pod [--policies epp-default-unsticky,epp-agentic,epp-default,...]
        [--seeds 0,1,2] [--rate 0.9] [--direct-rate 20] [--duration S] [--json PATH]"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bench import workloads as wl
from bench.drivers import ClusterSimDriver, TimedRouter, outcome
from bench.metrics import summarize
from bench.policies import make_policy
from bench.policies.service_bypass import ServiceBypass
from bench.routing_peers import capacity, mean_se, scenario_of
from bench.scenarios import SCENARIOS
from bench.workloads.shared_pool import DIRECT, TRAFFIC_HEADER
from ray_epp.simulator import SimRequest, run_cluster_sim
from ray_epp.simulator.report import OK

HOT_POD = "sim-0"


def workload(rate: float, direct_rate: float, seed: int, duration_s: float | None = None) -> list[SimRequest]:
    sc = scenario_of("agentic", duration_s)
    routed = sc.run_workload(rate, seed)
    span = max(r.arrival_time for r in routed)
    direct = wl.random_prompt_workload(wl.uniform_spec(max(1, int(direct_rate * span))), direct_rate, seed + 1000)
    for r in direct:
        r.request_id = f"direct-{r.request_id}"
        r.headers[TRAFFIC_HEADER] = DIRECT
    return sorted(routed + direct, key=lambda r: r.arrival_time)


def run(policy: str, requests: list[SimRequest], seed: int) -> dict[str, Any]:
    inner = TimedRouter(make_policy(policy, seed))
    router = ServiceBypass(inner, seed, pod=HOT_POD)
    report = run_cluster_sim(SCENARIOS["agentic"].pods(), requests, router, scrape_interval=0.05, seed=seed)
    by_id = {r.request_id: r for r in requests}
    mine = [outcome(r, by_id[r.request_id], set()) for r in report.results if r.request_id not in router.direct]
    m = summarize(mine, report.duration)
    on_hot = sum(1 for r in report.results if r.request_id not in router.direct and r.pod == HOT_POD)
    direct_ok = [r for r in report.results if r.request_id in router.direct and r.status == OK]
    return {
        "ttft_p50_ms": m["ttft_ms"]["p50"],
        "ttft_p90_ms": m["ttft_ms"]["p90"],
        "ttft_p99_ms": m["ttft_ms"]["p99"],
        "output_tok_s": m["output_throughput"],
        "prefix_hit": m["prefix_hit_rate"],
        "share_on_hot_pod": on_hot / max(1, len(mine)),
        "direct_ttft_p90_ms": summarize([outcome(r, by_id[r.request_id], set()) for r in direct_ok])["ttft_ms"]["p90"],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--policies", default="epp-default-unsticky,epp-agentic,epp-default,epp-llmd-sticky-until-saturated"
    )
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--rate", type=float, default=0.9, help="the router's sessions, x the agentic capacity")
    ap.add_argument("--direct-rate", type=float, default=20.0, help="req/s sent straight to the hot pod")
    ap.add_argument("--duration", type=float, help="seconds of the router's arrivals (default: the scenario's)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    policies = args.policies.split(",")
    cells: dict[int, dict[str, dict[str, Any]]] = {}
    for seed in (int(s) for s in args.seeds.split(",")):
        rate = args.rate * capacity("agentic", seed, ClusterSimDriver())
        requests = workload(rate, args.direct_rate, seed, args.duration)
        cells[seed] = {p: run(p, requests, seed) for p in policies}
        if args.json:
            Path(args.json).write_text(json.dumps({str(k): v for k, v in cells.items()}, indent=1))
    ref = policies[0]
    print(f"| policy | TTFT p50 ms | p90 ms | p99 ms | prefix hit | share on {HOT_POD} | direct p90 ms ", end="")
    print(f"| p90 / {ref}'s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for p in policies:
        mean = {k: sum(c[p][k] for c in cells.values()) / len(cells) for k in cells[next(iter(cells))][p]}
        r = mean_se([c[p]["ttft_p90_ms"] / c[ref]["ttft_p90_ms"] for c in cells.values()])
        print(
            f"| {p} | {mean['ttft_p50_ms']:.1f} | {mean['ttft_p90_ms']:.1f} | {mean['ttft_p99_ms']:.1f} "
            f"| {mean['prefix_hit']:.3f} | {mean['share_on_hot_pod']:.3f} | {mean['direct_ttft_p90_ms']:.0f} "
            f"| {r[0]:.3f} ± {r[1]:.3f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
