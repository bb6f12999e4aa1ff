"""`epp bench <scenario>…`: routing-quality sweeps in the cluster simulation, with a report.

    epp bench list
    epp bench shared-prefix [--policies epp-default,sglang-cache-aware] [--rates 0.5x,0.9x,120]
    epp bench all                    # every scenario; ShareGPT is skipped if its package is missing
    epp bench shared-prefix --driver e2e [--policies epp-default,sglang-round-robin] [--rates 0.5x,0.9x]
                                     # real routers over HTTP in front of simulated pods (bench/e2e.py)

Writes bench/results/<scenario>.json, .md and .png (or under --out) and prints the Markdown."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

from bench.report import RESULTS_DIR


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenarios", nargs="+", metavar="scenario", help="a scenario name, 'all', or 'list'")
    parser.add_argument("--policies", help="comma-separated policies (default: the scenario's list)")
    parser.add_argument(
        "--rates", help="comma-separated rates: fractions of the calibrated capacity (0.9x) or req/s (120)"
    )
    parser.add_argument("--capacity", type=float, help="skip the calibration: the pool's capacity in req/s")
    parser.add_argument("--duration", type=float, help="seconds of arrivals per rate (default: the scenario's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--scrape-interval", type=float, default=0.05, help="metrics scrape period (s)")
    parser.add_argument("--out", default=str(RESULTS_DIR), help="directory for the JSON, Markdown and PNG")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    e2e = parser.add_argument_group("end to end (--driver e2e)")
    e2e.add_argument("--driver", choices=("cluster-sim", "e2e"), default="cluster-sim", help="default: cluster-sim")
    e2e.add_argument("--pods", type=int, default=4, help="e2e: the first N of the scenario's pods (default 4)")
    e2e.add_argument("--max-requests", type=int, default=400, help="e2e: the first N arrivals per rate (default 400)")
    e2e.add_argument("--time-scale", type=float, default=1.0, help="e2e: the simulated pods' latency scale")
    e2e.add_argument(
        "--start-timeout", type=float, default=120.0, help="e2e: seconds a target may take to start (default 120)"
    )
    e2e.add_argument(
        "--kv-events",
        action="store_true",
        help="e2e: every pod publishes vLLM KV events, whichever target runs (on anyway for dynamo-kv)",
    )
    e2e.add_argument(
        "--api",
        choices=("chat", "responses", "messages", "mixed"),
        default="chat",
        help="e2e: send chat requests over this API (responses: chained by previous_response_id; "
        "mixed: each session one of the three); default chat",
    )


def run_bench(args: argparse.Namespace) -> int:
    from bench.drivers import ClusterSimDriver
    from bench.e2e import target
    from bench.policies import known_policies, make_policy
    from bench.report import write_report
    from bench.runner import RateSpec, run_sweep
    from bench.scenarios import SCENARIOS
    from bench.targets import check
    from bench.workloads import WorkloadUnavailable

    names = list(args.scenarios)
    if names == ["list"]:
        for s in SCENARIOS.values():
            print(f"{s.name:20} {s.title}: {s.description}")
        print("policies:", ", ".join(known_policies()))
        return 0
    if "all" in names:
        names = list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        print(f"unknown scenario {unknown[0]!r}; known: {', '.join(SCENARIOS)}, all, list", file=sys.stderr)
        return 2
    try:
        policies = [p.strip() for p in args.policies.split(",") if p.strip()] if args.policies else None
        for p in policies or []:
            target(p) if args.driver == "e2e" else make_policy(p)  # fail before any run
        rates = [RateSpec.parse(r) for r in args.rates.split(",")] if args.rates else None
    except ValueError as err:
        print(str(err), file=sys.stderr)
        return 2
    missed = 0
    for name in names:
        scenario = SCENARIOS[name]
        if args.duration:
            scenario = dataclasses.replace(scenario, duration_s=args.duration)
        driver = calibration = ClusterSimDriver(args.scrape_interval)
        run_policies = policies
        if args.driver == "e2e":
            scenario, driver, calibration, run_policies = _e2e_setup(scenario, policies, args)
        try:
            result = run_sweep(
                scenario,
                run_policies,
                rates,
                driver=driver,
                seed=args.seed,
                capacity=args.capacity,
                calibration_driver=calibration,
                progress=not args.no_progress,
                command=_command(name, args),
            )
        except WorkloadUnavailable as err:
            print(f"{name}: {err}", file=sys.stderr)
            continue
        result["verdicts"] = check(result)
        missed += sum(1 for v in result["verdicts"] if v["passed"] is False)
        paths = write_report(result, args.out)
        print(Path(paths["markdown"]).read_text())
        print("wrote", ", ".join(str(p) for p in paths.values()))
    return 1 if args.strict and missed else 0


def _e2e_setup(scenario: Any, policies: list[str] | None, args: argparse.Namespace) -> tuple[Any, Any, Any, list[str]]:
    """The scenario on its first --pods pods, the e2e driver, the calibration driver (the cluster
    simulation on the same pods: the same model time as the simulated servers) and the targets that
    are installed."""
    from bench.drivers import ClusterSimDriver
    from bench.e2e import DEFAULT_TARGETS, E2EDriver, installed, unavailable

    pods = scenario.pods()[: args.pods]
    scenario = dataclasses.replace(scenario, pods=lambda: list(pods))
    run = []
    for p in policies or DEFAULT_TARGETS:
        if not installed(p):
            print(f"{unavailable(p)}: skipped", file=sys.stderr)
            continue
        run.append(p)
    driver = E2EDriver(time_scale=args.time_scale, max_requests=args.max_requests, api=args.api,
                       start_timeout_s=args.start_timeout, kv_events=args.kv_events)  # fmt: skip
    return scenario, driver, ClusterSimDriver(args.scrape_interval), run


def _command(name: str, args: argparse.Namespace) -> str:
    parts = ["epp bench", name]
    for flag, value in (
        ("--policies", args.policies),
        ("--rates", args.rates),
        ("--capacity", args.capacity),
        ("--duration", args.duration),
    ):
        if value:
            parts += [flag, str(value)]
    if args.driver == "e2e":
        parts += ["--driver e2e --pods", str(args.pods), "--max-requests", str(args.max_requests)]
        parts += ["--time-scale", str(args.time_scale)]
        if args.kv_events:
            parts.append("--kv-events")
        if args.api != "chat":
            parts += ["--api", args.api]
        if args.start_timeout != 120.0:
            parts += ["--start-timeout", str(args.start_timeout)]
    if args.seed:
        parts += ["--seed", str(args.seed)]
    if args.scrape_interval != 0.05:
        parts += ["--scrape-interval", str(args.scrape_interval)]
    return " ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    add_bench_arguments(parser)
    return run_bench(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
