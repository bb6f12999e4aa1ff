"""Ray EPP's routing against today's peers, one table per workload: every policy on the same
requests (one seeded workload per scenario, seed and rate), in the cluster simulation, over
several seeds; per seed the ratio of each policy's TTFT p90 to a reference policy's, then the mean
and standard error over the seeds.

    python -m bench.routing_peers [--scenarios shared-prefix,cache-pressure,agentic,uniform]
        [--policies epp-default,epp-default-unsticky,epp-llmd-sticky-until-saturated,sglang-cache-aware,dynamo-kv]
        [--seeds 0,1,2] [--rate 0.9] [--duration S] [--reference epp-default] [--json PATH]
    python -m bench.routing_peers --sweeps bench/results/e2e/peers/seed0/*.json   # `epp bench` results
                                  # (end to end, say), one table per scenario and rung, seeds merged

The rate is a fraction of each scenario's capacity for that seed: the capacity its calibration
(`bench.runner.calibrate`, round-robin) measured, taken from `CALIBRATED` when the seed is there
(the calibration is deterministic for a seed, so this skips only its minutes), else calibrated now."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
from pathlib import Path
from typing import Any

from bench.drivers import ClusterSimDriver
from bench.runner import calibrate
from bench.scenarios import SCENARIOS, Scenario

# (scenario, seed) -> requests/s that `calibrate` measured (2026-12-07 runs of `epp bench`).
CALIBRATED: dict[tuple[str, int], float] = {
    **dict(zip((("cache-pressure", s) for s in range(5)), (58.64, 58.07, 57.66, 60.0, 58.34), strict=True)),
    **dict(zip((("shared-prefix", s) for s in range(5)), (152.8, 152.03, 151.09, 152.19, 152.02), strict=True)),
    **dict(zip((("uniform", s) for s in range(5)), (229.69, 229.47, 231.32, 229.18, 231.29), strict=True)),
    **dict(zip((("agentic", s) for s in range(5)), (91.07, 91.89, 93.5, 91.41, 91.63), strict=True)),
}
FIGURES = ("ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "output_tok_s", "prefix_hit")


def capacity(scenario: str, seed: int, driver: ClusterSimDriver) -> float:
    known = CALIBRATED.get((scenario, seed))
    return known if known is not None else calibrate(SCENARIOS[scenario], driver, seed)["request_rate"]


def scenario_of(name: str, duration_s: float | None = None) -> Scenario:
    """The scenario, with `duration_s` seconds of arrivals instead of its own when given."""
    sc = SCENARIOS[name]
    return sc if duration_s is None else dataclasses.replace(sc, duration_s=duration_s)


def run_cell(
    scenario: str, policies: list[str], seed: int, fraction: float, duration_s: float | None = None
) -> dict[str, dict[str, float]]:
    """Every policy on the same requests: the figures per policy."""
    driver = ClusterSimDriver()
    sc = scenario_of(scenario, duration_s)
    rate = fraction * capacity(scenario, seed, driver)
    workload, pods = sc.run_workload(rate, seed), sc.pods()
    out: dict[str, dict[str, float]] = {}
    for policy in policies:
        m = driver.run(policy, pods, workload, seed).metrics
        out[policy] = {**figures_of(m), "rate": rate}
    return out


def mean_se(values: list[float]) -> tuple[float, float]:
    if not values:
        return math.nan, math.nan
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0
    return statistics.fmean(values), se


PEER_CONFIGS = ("epp-llmd-sticky-until-saturated",)  # configs of ours that are a peer's routing, run by us


def is_peer(policy: str) -> bool:
    return not policy.startswith("epp") or policy in PEER_CONFIGS


def table(scenario: str, cells: dict[int, dict[str, dict[str, float]]], reference: str) -> str:
    """Means over the seeds; per seed the ratio of each policy's TTFT p90 to the reference's and,
    for ours, to the best peer's in that seed (mean ± standard error)."""
    policies = list(next(iter(cells.values())))
    peers = [p for p in policies if is_peer(p)]
    lines = [
        f"### {scenario} ({len(cells)} seeds)",
        "",
        f"| policy | TTFT p50 ms | p90 ms | p99 ms | output tok/s | prefix hit | p90 / {reference}'s "
        "| p90 / best peer's |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for policy in policies:
        means = {f: statistics.fmean(c[policy][f] for c in cells.values()) for f in FIGURES}
        ratio = mean_se([c[policy]["ttft_p90_ms"] / c[reference]["ttft_p90_ms"] for c in cells.values()
                         if reference in c])  # fmt: skip
        best = "" if is_peer(policy) or not peers else "{:.3f} ± {:.3f}".format(*mean_se([
            c[policy]["ttft_p90_ms"] / min(c[p]["ttft_p90_ms"] for p in peers) for c in cells.values()
        ]))  # fmt: skip
        lines.append(
            f"| {policy} | {means['ttft_p50_ms']:.1f} | {means['ttft_p90_ms']:.1f} | {means['ttft_p99_ms']:.1f} "
            f"| {means['output_tok_s']:,.0f} | {means['prefix_hit']:.3f} | {ratio[0]:.3f} ± {ratio[1]:.3f} | {best} |"
        )
    return "\n".join(lines)


def figures_of(m: dict[str, Any]) -> dict[str, float]:
    t = m["ttft_ms"]
    return {"ttft_p50_ms": t["p50"], "ttft_p90_ms": t["p90"], "ttft_p99_ms": t["p99"],
            "output_tok_s": m["output_throughput"], "prefix_hit": m["prefix_hit_rate"]}  # fmt: skip


def from_sweeps(paths: list[str]) -> dict[str, Any]:
    """`epp bench` results (any driver; one seed each) in this module's JSON shape:
    "<scenario>@<fraction>" -> policy -> seed -> figures."""
    out: dict[str, Any] = {}
    for path in paths:
        sweep = json.loads(Path(path).read_text())
        for run in sweep["runs"]:
            key = f"{sweep['scenario']}@{run['fraction']:.2f}"
            figures = {**figures_of(run["metrics"]), "rate": run["rate"]}
            out.setdefault(key, {}).setdefault(run["policy"], {})[str(sweep["seed"])] = figures
    return out


def tables_from(results: dict[str, Any], reference: str) -> str:
    """The tables of a JSON this module wrote (cells: the seeds every policy has)."""
    out = []
    for key, by_policy in sorted(results.items()):
        seeds = set.intersection(*(set(s) for s in by_policy.values()))
        cells = {int(seed): {p: figs[seed] for p, figs in by_policy.items()} for seed in sorted(seeds, key=int)}
        if cells:
            out.append(table(key, cells, reference if reference in by_policy else next(iter(by_policy))))
    return "\n\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", default="shared-prefix,cache-pressure,agentic,uniform")
    ap.add_argument(
        "--policies",
        default="epp-default,epp-default-unsticky,epp-llmd-sticky-until-saturated,sglang-cache-aware,dynamo-kv",
    )
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--rate", type=float, default=0.9, help="fraction of each scenario's capacity")
    ap.add_argument("--reference", default="epp-default", help="the policy the ratios divide by (if run)")
    ap.add_argument("--duration", type=float, help="seconds of arrivals per run (default: the scenario's)")
    ap.add_argument("--json", help="write every figure here (merged with what the file holds)")
    ap.add_argument("--tables", nargs="+", metavar="JSON", help="print the tables of these results and exit")
    ap.add_argument("--sweeps", nargs="+", metavar="JSON", help="print the tables of `epp bench` results and exit")
    args = ap.parse_args(argv)
    if args.sweeps:
        print(tables_from(from_sweeps(args.sweeps), args.reference))
        return 0
    if args.tables:
        merged: dict[str, Any] = {}
        for name in args.tables:
            for key, by_policy in json.loads(Path(name).read_text()).items():
                if not isinstance(by_policy, dict):  # a note
                    continue
                for policy, seeds in by_policy.items():
                    merged.setdefault(key, {}).setdefault(policy, {}).update(seeds)
        print(tables_from(merged, args.reference))
        return 0
    policies = args.policies.split(",")
    seeds = [int(s) for s in args.seeds.split(",")]
    results: dict[str, Any] = {}
    path = Path(args.json) if args.json else None
    if path is not None and path.is_file():
        results = json.loads(path.read_text())
    for scenario in args.scenarios.split(","):
        if scenario not in SCENARIOS:
            ap.error(f"unknown scenario {scenario!r}")
        key = f"{scenario}@{args.rate:.2f}"
        stored = results.setdefault(key, {})
        cells = {}
        for seed in seeds:  # written after each seed: a long sweep keeps what it finished
            cells[seed] = run_cell(scenario, policies, seed, args.rate, args.duration)
            for policy, figures in cells[seed].items():
                stored.setdefault(policy, {})[str(seed)] = figures
            if path is not None:
                path.write_text(json.dumps(results, indent=1, sort_keys=True))
        print(table(scenario, cells, args.reference), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
