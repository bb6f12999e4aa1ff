"""Precise vs approximate prefix routing vs sglang-router's cache_aware, in the cluster simulation:
one run per scenario and policy at one rate, side by side. The simulated pods publish their KV
events (kvevents, in virtual time) to the precise policy; every policy sees the same requests.

    python -m bench.precise_routing [--scenarios shared-prefix,shared-prefix-llmd,cache-pressure]
        [--rate 0.9] [--capacity shared-prefix=152.8,...] [--duration 20] [--seed 0] [--policies ...]
        [--seeds 0-29 --json results.json]    # many seeds: per-seed ratios to epp-default at the end
    python -m bench.precise_routing --tables results.json [more.json ...]

Besides `epp bench`'s scenarios, `cache-pressure-drift` (bench/workloads/drift.py): cache-pressure
on pods that tokenize with a real tokenizer, prose and hex content, chat requests. There the
precise policy tokenizes with a `token-producer` reading the same tokenizer.json (as a gateway
configured with the model's tokenizer does); without a tokenizer it takes the ids a pod's
`/tokenize` would answer. And `cache-pressure-shared` (bench/workloads/shared_pool.py): the drift
workload with a third of the requests sent to the pods' Service directly, bypassing the router
(bench/policies/service_bypass.py); its rows are the gateway's requests, and a second table gives
the direct clients' TTFT. And `cache-pressure-offload`: cache-pressure-shared on pods that also
have a CPU-offload tier of twice their GPU cache (`cpu_offload_blocks`), where the precise index
sees which tier each block is in; compare `epp-precise` (llm-d's weights, cpu 0.8) with
`epp-precise-cpu-as-gpu` and `epp-precise-gpu-only` (cpu 1 and 0).

`--rate` is a fraction of the scenario's capacity (round-robin's, from `--capacity` or the last
`epp bench` result in bench/results, else calibrated). Prints TTFT p50/p90/p99, throughput, prefix
hit rate, and how often each index's predicted cached tokens for the chosen pod were right (within
one block of what the pod served from its cache; cache_aware predicts no token count), over all
requests and over those where the prediction or the pod's cache hit was not zero, and the TTFT
p90 without queueing (`service_p90`: the floor routing alone cannot lower).

With `--seeds` each seed runs every policy on the same requests, the figures go to `--json`
(routing_peers' shape, merged per seed, written after each seed) and the end prints, per policy,
the mean over seeds of its ratios to `epp-default` in the same seed (mean ± standard error).

`--policies` picks among epp-default (ray_epp/configs/default.yaml: the approximate index), epp-precise
(bench/configs/precise.yaml), any epp-precise-... config there (e.g. epp-precise-speculative)
and sglang-cache-aware."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from bench.policies import SchedulerRouter, config_path, make_policy
from bench.policies.service_bypass import ServiceBypass
from bench.routing_peers import mean_se
from bench.runner import calibrate
from bench.scenarios import NEAR_SATURATION, Scenario, build_scenarios
from bench.tokenizer_fixture import fixture_tokenizer
from bench.workloads import CACHE_PRESSURE, CACHE_PRESSURE_POD_BLOCKS
from bench.workloads.drift import drift_workload
from bench.workloads.shared_pool import is_direct, shared_pool_workload
from ray_epp.simulator import ClusterSim, SimReport, make_pod_configs
from ray_epp.simulator.report import OK, Dist
from scheduler import load_config

POLICIES = ("epp-default", "epp-precise", "sglang-cache-aware")
PRECISE = "epp-precise"  # and every policy named epp-precise-...: gets the pods' tokenizer
RESULTS = Path(__file__).parent / "results"


OFFLOAD_TIER_BLOCKS = 2 * CACHE_PRESSURE_POD_BLOCKS  # each pod's CPU tier in cache-pressure-offload


def _on_drift_pods(name: str, title: str, source: str, workload, cpu_blocks: int = 0) -> Scenario:
    """A scenario on 8 cache-pressure pods that tokenize with the bench's real tokenizer (and
    offload to a CPU tier of `cpu_blocks` each)."""
    return Scenario(
        name=name,
        title=title,
        description=source,
        pods=lambda: make_pod_configs(
            8,
            num_gpu_blocks=CACHE_PRESSURE_POD_BLOCKS,
            tokenizer=str(fixture_tokenizer()),
            cpu_offload_blocks=cpu_blocks,
        ),
        workload=lambda rate, seed, n: workload(rate, seed, n, CACHE_PRESSURE),
        fractions=(NEAR_SATURATION,),
        policies=POLICIES,
        duration_s=40,
    )


def drift_scenario() -> Scenario:
    title = "Cache pressure, real tokenizer, prose and hex content (chat)"
    return _on_drift_pods("cache-pressure-drift", title, "bench/workloads/drift.py", drift_workload)


def shared_scenario() -> Scenario:
    title = "cache-pressure-drift with a third of the traffic bypassing the router"
    return _on_drift_pods("cache-pressure-shared", title, "bench/workloads/shared_pool.py", shared_pool_workload)


def offload_scenario() -> Scenario:
    title = "cache-pressure-shared on pods with a CPU-offload tier (2x their GPU cache)"
    return _on_drift_pods(
        "cache-pressure-offload", title, "bench/workloads/shared_pool.py", shared_pool_workload, OFFLOAD_TIER_BLOCKS
    )


def scenarios() -> dict[str, Scenario]:
    return {
        **build_scenarios(),
        "cache-pressure-drift": drift_scenario(),
        "cache-pressure-shared": shared_scenario(),
        "cache-pressure-offload": offload_scenario(),
    }


def precise_config(tokenizer: str, policy: str = PRECISE) -> dict:
    """bench/configs/precise.yaml (or the policy's precise config) with a token-producer on the
    pods' tokenizer.json, as a gateway configured with the model's tokenizer has it."""
    data = yaml.safe_load(config_path(policy).read_text())
    data["plugins"].insert(0, {"type": "token-producer", "parameters": {"local": {"tokenizerPath": tokenizer}}})
    return data


def precise_router(tokenizer: str, seed: int, policy: str = PRECISE) -> SchedulerRouter:
    return SchedulerRouter(load_config(precise_config(tokenizer, policy)), seed=seed)


def capacity_of(name: str, given: dict[str, float], seed: int) -> float:
    if name in given:
        return given[name]
    path = RESULTS / f"{name}.json"
    if path.is_file():
        return float(json.loads(path.read_text())["capacity"]["request_rate"])
    return float(calibrate(scenarios()[name], seed=seed)["request_rate"])


def run(
    scenario_name: str, rate_x: float, capacity: float, duration: float, seed: int, policies: tuple[str, ...] = POLICIES
) -> list[dict]:
    rate = rate_x * capacity
    rows = []
    for policy in policies:
        requests, router, report = run_policy(scenario_name, policy, rate, duration, seed)
        bypassed = any(is_direct(r) for r in requests)
        direct = None
        if bypassed:  # the gateway's requests in the row, the direct clients' apart
            direct = _part(report, _ids(requests, True))
            report = _part(report, _ids(requests, False))
        pred = getattr(router, "predictions", None)
        rows.append(
            {
                "scenario": scenario_name,
                "policy": policy,
                "rate": round(rate, 1),
                "requests": len(requests),
                "direct": direct,
                "ttft_p50": report.ttft.p50,
                "ttft_p90": report.ttft.p90,
                "ttft_p99": report.ttft.p99,
                "service_p90": service_p90(report),
                "throughput": report.output_token_throughput,
                "hit_rate": report.prefix_hit_rate,
                "predicted_right": (pred["right"] / pred["total"]) if pred and pred["total"] else None,
                "predicted_right_cached": (pred["right_cached"] / pred["total_cached"])
                if pred and pred["total_cached"]
                else None,
            }
        )
    return rows


def run_policy(
    scenario_name: str, policy: str, rate: float, duration: float, seed: int, wrap: Callable[[Any], Any] | None = None
) -> tuple[list, Any, SimReport]:
    """One policy's run at `rate` req/s: the requests (the same at a seed for every policy), the
    router (SchedulerRouter for ours; `wrap` sees it before the run) and the report over every
    request, direct ones included."""
    scenario = scenarios()[scenario_name]
    scenario.duration_s = duration
    tokenizer = scenario.pods()[0].tokenizer
    requests = scenario.run_workload(rate, seed)
    precise = policy.startswith(PRECISE) and tokenizer
    router = precise_router(tokenizer, seed, policy) if precise else make_policy(policy, seed)
    if wrap is not None:
        router = wrap(router)
    bypassed = any(is_direct(r) for r in requests)
    report = ClusterSim(scenario.pods(), ServiceBypass(router, seed) if bypassed else router, seed=seed).run(requests)
    return requests, router, report


def service_p90(report: SimReport) -> float:
    """TTFT p90 with each request's queue wait taken out: what the p90 would be if nothing ever
    waited, given the cache hits the policy got. The floor a policy's p90 can reach by balancing
    load alone; only more hits lower it."""
    ok = sorted(r.ttft - r.queue_wait for r in report.results if r.status == OK)
    return Dist.of(ok).p90 if ok else float("nan")


def _ids(requests: list, direct: bool) -> set[str]:
    return {r.request_id for r in requests if is_direct(r) == direct}


def _part(report: SimReport, ids: set[str]) -> SimReport:
    """The report over some of its requests, on the whole run's duration."""
    return SimReport(
        [r for r in report.results if r.request_id in ids], report.pods, report.duration, report.wall_time_s
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenarios", default="shared-prefix,shared-prefix-llmd,cache-pressure")
    ap.add_argument("--rate", type=float, default=0.9)
    ap.add_argument("--capacity", default="")
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--policies", default=",".join(POLICIES), help="epp-precise... policies get the pods' tokenizer")
    ap.add_argument("--seeds", default="", help="seeds to run, e.g. 0-29 or 0,3,5 (instead of --seed)")
    ap.add_argument("--json", help="with --seeds: write every figure here (merged with what the file holds)")
    ap.add_argument("--tables", nargs="+", metavar="JSON", help="print the per-seed ratios of these results, exit")
    args = ap.parse_args()
    if args.tables:
        print(ratio_tables(merged_results(args.tables)))
        return
    policies = tuple(args.policies.split(","))
    if args.seeds:
        run_seeds(args, policies, parse_seeds(args.seeds))
        return
    given = {k: float(v) for k, v in (kv.split("=") for kv in args.capacity.split(",") if kv)}
    known = scenarios()
    direct_rows: list[dict] = []
    print(f"load average {os.getloadavg()[0]:.2f}")
    print(
        "| scenario | policy | req/s | TTFT p50 s | p90 s | p99 s | output tok/s | prefix hit | predicted right "
        "| right where cached | p90 without queueing s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name in args.scenarios.split(","):
        if name not in known:
            print(f"| {name} | (no such scenario here) |")
            continue
        capacity = capacity_of(name, given, args.seed)
        print(f"{name}: capacity {capacity:.1f} req/s (round-robin), load average {os.getloadavg()[0]:.2f}", flush=True)
        for r in run(name, args.rate, capacity, args.duration, args.seed, policies):
            if r["direct"] is not None:
                direct_rows.append(r)
            right = "n/a" if r["predicted_right"] is None else f"{r['predicted_right']:.2f}"
            cached = "n/a" if r["predicted_right_cached"] is None else f"{r['predicted_right_cached']:.2f}"
            print(
                f"| {r['scenario']} | {r['policy']} | {r['rate']} | {r['ttft_p50']:.3f} | {r['ttft_p90']:.3f} | "
                f"{r['ttft_p99']:.3f} | {r['throughput']:.0f} | {r['hit_rate']:.2f} | {right} | {cached} | "
                f"{r['service_p90']:.3f} |",
                flush=True,
            )
    if direct_rows:
        print("\ndirect clients (bypassing the router) in the same runs:")
        print("| scenario | router | requests | TTFT p50 s | p90 s | p99 s | output tok/s | prefix hit |")
        print("|---|---|---|---|---|---|---|---|")
        for r in direct_rows:
            d = r["direct"]
            print(
                f"| {r['scenario']} | {r['policy']} | {d.completed} | {d.ttft.p50:.3f} | {d.ttft.p90:.3f} | "
                f"{d.ttft.p99:.3f} | {d.output_token_throughput:.0f} | {d.prefix_hit_rate:.2f} |"
            )
    print(f"load average {os.getloadavg()[0]:.2f}")


# -- many seeds ---------------------------------------------------------------------------------

REFERENCE = "epp-default"  # what the ratios divide by: the approximate index
TARGET = 0.8  # precise's TTFT p90 against the approximate index's


def parse_seeds(text: str) -> list[int]:
    """`0-29`, `0,3,5` or both (`0-4,9`)."""
    seeds: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        seeds += range(int(first), int(last or first) + 1)
    return seeds


def seed_figures(row: dict) -> dict[str, float | None]:
    """One run's figures in bench.routing_peers' JSON shape, plus the floor and the direct clients'."""
    direct = row["direct"]
    return {
        "ttft_p50_ms": row["ttft_p50"] * 1000,
        "ttft_p90_ms": row["ttft_p90"] * 1000,
        "ttft_p99_ms": row["ttft_p99"] * 1000,
        "output_tok_s": row["throughput"],
        "prefix_hit": row["hit_rate"],
        "service_p90_ms": row["service_p90"] * 1000,
        "direct_p90_ms": direct.ttft.p90 * 1000 if direct is not None else None,
        "rate": row["rate"],
    }


def run_seeds(args: argparse.Namespace, policies: tuple[str, ...], seeds: list[int]) -> None:
    given = {k: float(v) for k, v in (kv.split("=") for kv in args.capacity.split(",") if kv)}
    path = Path(args.json) if args.json else None
    results: dict[str, dict[str, dict[str, dict]]] = json.loads(path.read_text()) if path and path.is_file() else {}
    for name in args.scenarios.split(","):
        capacity = capacity_of(name, given, seeds[0])
        stored = results.setdefault(f"{name}@{args.rate:.2f}", {})
        for seed in seeds:  # written after each seed: a long sweep keeps what it finished
            for row in run(name, args.rate, capacity, args.duration, seed, policies):
                stored.setdefault(row["policy"], {})[str(seed)] = seed_figures(row)
            if path is not None:
                path.write_text(json.dumps(results, indent=1, sort_keys=True))
            p90 = " / ".join(f"{stored[p][str(seed)]['ttft_p90_ms']:.0f}" for p in policies)
            print(f"{name} seed {seed}: TTFT p90 ms {p90}, load average {os.getloadavg()[0]:.2f}", flush=True)
    print(ratio_tables(results))


def merged_results(paths: list[str]) -> dict[str, dict[str, dict[str, dict]]]:
    merged: dict[str, dict[str, dict[str, dict]]] = {}
    for name in paths:
        for key, by_policy in json.loads(Path(name).read_text()).items():
            for policy, seeds in by_policy.items():
                merged.setdefault(key, {}).setdefault(policy, {}).update(seeds)
    return merged


def ratio_tables(results: dict[str, dict[str, dict[str, dict]]]) -> str:
    """Per scenario and rate, per policy: the mean TTFT p90 and, over the seeds every policy ran,
    the mean ± standard error of its per-seed ratios to the approximate index's figures."""
    out = []
    for key, by_policy in sorted(results.items()):
        if REFERENCE not in by_policy:
            continue
        seeds = sorted(set.intersection(*(set(s) for s in by_policy.values())), key=int)
        ref = by_policy[REFERENCE]
        out += [
            f"\n{key} ({len(seeds)} seeds; ratios to {REFERENCE} in the same seed, mean ± standard error)",
            "| policy | TTFT p90 ms (mean) | p90 / approx. | p50 / approx. | p99 / approx. | output tok/s / approx. "
            f"| prefix hit | p90 without queueing ms | seeds ≤ {TARGET}x |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for policy, figs in by_policy.items():
            ratios = {
                f: mean_se([figs[s][f] / ref[s][f] for s in seeds])
                for f in ("ttft_p90_ms", "ttft_p50_ms", "ttft_p99_ms", "output_tok_s")
            }
            under = sum(figs[s]["ttft_p90_ms"] <= TARGET * ref[s]["ttft_p90_ms"] for s in seeds)
            cells = " | ".join(f"{m:.3f} ± {se:.3f}" for m, se in ratios.values())
            mean = {
                f: sum(figs[s][f] for s in seeds) / len(seeds) for f in ("ttft_p90_ms", "prefix_hit", "service_p90_ms")
            }
            out.append(
                f"| {policy} | {mean['ttft_p90_ms']:.1f} | {cells} | {mean['prefix_hit']:.3f} "
                f"| {mean['service_p90_ms']:.1f} | {under} / {len(seeds)} |"
            )
    return "\n".join(out)


if __name__ == "__main__":
    main()
