"""Prefill/decode disaggregation: aggregated pods against the same pods split into prefill and decode.

The workload is llm-d's P/D guide's: long unique prompts (5,000 tokens, i.e. 20,000 characters at
the simulator's 4 characters a token) and 250 output tokens, Poisson arrivals over a ladder of rates.

* `sim` — the cluster simulation (virtual time, deterministic). 8 aggregated pods (role `both`,
  ray_epp/configs/default.yaml) against 8 pods split 4P+4D, 2P+6D, 6P+2D and 5P+3D (ray_epp/configs/pd.yaml,
  `SchedulerRouter` answering (prefill, decode) pairs). The ladder is in fractions of the
  aggregated pool's capacity, calibrated first (see `calibrate`). Two more workloads share a long
  prefix (16 groups of 4,992 tokens) followed by a unique suffix of 8 tokens (fewer than the
  decider's nonCachedTokens 16: decode-only once the prefix is cached, but only where the
  prefix-cache scorer matches more than its default 256 blocks: the "512 blocks" variant) or 256
  tokens (a new multi-turn-like turn: disaggregated again).
* `e2e` — the real gateway on Ray Serve (`EppDeployment`) in front of real-time simulated HTTP pods
  on 127.0.0.1: 4 aggregated pods (ray_epp/configs/default.yaml) against 2P+2D (ray_epp/configs/pd.yaml, the
  gateway's orchestrated hand-off), a few modest rates. The client streams (`stream: true`) and
  measures TTFT (first content event), ITL (mean gap between content events) and E2E, in model time
  (wall time / --time-scale); P/D decisions come from the gateway's `ray_epp_pd_handoffs_total`. The
  same workload through the cluster simulation on the same pods is shown alongside: its prediction.
  One Ray for the whole run, everything stopped at the end.

    .venv/bin/python -m bench.pd_benchmark [--quick] [sim|e2e|all]
    .venv/bin/python -m bench.pd_benchmark e2e --rounds   # 2P+2D: sequential rounds vs parallelStages

Writes bench/results/pd_sim.json and pd_e2e.json (pd_e2e_rounds.json with --rounds; pd_*_quick.json
with --quick, pd_e2e_ts<S>.json with --time-scale S other than 1) and prints Markdown."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bench.metrics import dist_ms
from bench.pd_figures import (
    DECODE_ONLY,
    PD,
    counts_delta,
    decision_counts,
    e2e_markdown,
    flow_throughput,
    flow_window,
    mean_ms,
    scheduler_time,
    sim_markdown,
)
from bench.policies.epp import SchedulerRouter
from ray_epp.simulator import PodConfig, SimReport, SimRequest, WorkloadSpec, generate_workload, run_cluster_sim
from ray_epp.simulator.report import OK
from scheduler import load_config
from scheduler.config.loader import read_config_file
from serve_app.cli.launch import DEFAULT_CONFIG

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "bench" / "results"
PD_CONFIG = str(ROOT / "ray_epp" / "configs" / "pd.yaml")

PROMPT_TOKENS = 5000
OUTPUT_TOKENS = 250
PREFIX_GROUPS = 16
PREFIX_TOKENS = 4992  # 312 whole blocks of 16: a request's cached part is exactly the prefix
SHORT_SUFFIX, LONG_SUFFIX = 8, 256  # below / above prefix-based-pd-decider's nonCachedTokens (16)


E2E_PORT = 18640  # the gateway's direct-ingress port (Serve's proxy at +88)


@dataclass(frozen=True, slots=True)
class Setup:
    """A pool: `prefill` + `decode` pods (ray_epp/configs/pd.yaml) or `both` aggregated pods (default.yaml).
    `match_blocks` overrides the prefix-cache-scorer's maxPrefixBlocksToMatch (256 in both configs);
    `parallel_stages` sets the disagg handler's parallelStages (None: as the config has it)."""

    prefill: int = 0
    decode: int = 0
    both: int = 0
    match_blocks: int | None = None
    parallel_stages: bool | None = None

    @property
    def name(self) -> str:
        name = f"{self.both} aggregated" if self.both else f"{self.prefill}P+{self.decode}D"
        name = name if self.match_blocks is None else f"{name}, {self.match_blocks} blocks"
        if self.parallel_stages is not None:
            name += ", one round" if self.parallel_stages else ", sequential rounds"
        return name

    @property
    def config_path(self) -> str:
        return DEFAULT_CONFIG if self.both else PD_CONFIG

    def config(self) -> dict[str, Any]:
        """The config as a dict, with the maxPrefixBlocksToMatch override applied."""
        data = yaml.safe_load(read_config_file(self.config_path))
        if self.match_blocks is not None:
            for plugin in data["plugins"]:
                if plugin["type"] == "prefix-cache-scorer":
                    plugin.setdefault("parameters", {})["maxPrefixBlocksToMatch"] = self.match_blocks
        if self.parallel_stages is not None:
            for plugin in data["plugins"]:
                if plugin["type"] == "disagg-profile-handler":
                    plugin.setdefault("parameters", {})["parallelStages"] = self.parallel_stages
        return data

    def router(self, seed: int = 0) -> SchedulerRouter:
        return SchedulerRouter(load_config(self.config()), seed=seed)

    def pods(self) -> list[PodConfig]:
        return (
            [PodConfig(name=f"prefill-{i}", role="prefill") for i in range(self.prefill)]
            + [PodConfig(name=f"decode-{i}", role="decode") for i in range(self.decode)]
            + [PodConfig(name=f"pod-{i}", role="both") for i in range(self.both)]
        )


AGGREGATED_8 = Setup(both=8)
SIM_SETUPS = (AGGREGATED_8, Setup(4, 4), Setup(2, 6), Setup(6, 2), Setup(5, 3))
QUICK_SIM_SETUPS = (AGGREGATED_8, Setup(4, 4))
PREFIX_SETUPS = (AGGREGATED_8, Setup(4, 4), Setup(4, 4, match_blocks=512))
E2E_SETUPS = (Setup(both=4), Setup(2, 2))
# `e2e --rounds`: the same 2P+2D pool, its P/D decision in two actor rounds or in one (parallelStages),
# in the order A B B A so that a load drifting over the run weighs on both alike.
_SEQ, _ONE = Setup(2, 2, parallel_stages=False), Setup(2, 2, parallel_stages=True)
E2E_ROUNDS_SETUPS = (_SEQ, _ONE, _ONE, _SEQ)

# The sim's ladder, in fractions of the aggregated pool's calibrated capacity.
LADDER = (0.25, 0.5, 0.75, 0.9, 1.0, 1.25, 1.5)
QUICK_LADDER = (0.5, 1.0, 1.5)
PROBES = (0.8, 1.0, 1.2, 1.4, 1.6)  # x the burst estimate


# ---------------------------------------------------------------------------------------- workloads


def long_prompts(rate: float, duration: float, seed: int) -> list[SimRequest]:
    """Unique 5,000-token prompts, 250 output tokens (ignore_eos), Poisson at `rate` for `duration` s
    (rate 0: a burst of `duration` requests at t=0)."""
    n = int(duration) if rate <= 0 else max(1, round(rate * duration))
    spec = WorkloadSpec(num_requests=n, rate=rate, prompt_tokens=(PROMPT_TOKENS, PROMPT_TOKENS),
                        output_tokens=(OUTPUT_TOKENS, OUTPUT_TOKENS), seed=seed)  # fmt: skip
    return generate_workload(spec)


def shared_prefix(rate: float, duration: float, seed: int, suffix_tokens: int) -> list[SimRequest]:
    """Each prompt: one of 16 shared 4,992-token prefixes (uniform popularity) + a unique suffix."""
    spec = WorkloadSpec(num_requests=max(1, round(rate * duration)), rate=rate, prefix_groups=PREFIX_GROUPS,
                        prefix_tokens=PREFIX_TOKENS, prompt_tokens=(suffix_tokens, suffix_tokens),
                        output_tokens=(OUTPUT_TOKENS, OUTPUT_TOKENS), seed=seed)  # fmt: skip
    return generate_workload(spec)


WORKLOADS = {
    "long-prompt": ("5,000 unique prompt tokens, 250 output tokens", lambda r, d, s: long_prompts(r, d, s)),
    "shared-prefix-short": (
        f"a shared {PREFIX_TOKENS:,}-token prefix (16 groups) + {SHORT_SUFFIX} unique tokens, 250 output tokens",
        lambda r, d, s: shared_prefix(r, d, s, SHORT_SUFFIX),
    ),
    "shared-prefix-long": (
        f"a shared {PREFIX_TOKENS:,}-token prefix (16 groups) + {LONG_SUFFIX} unique tokens, 250 output tokens",
        lambda r, d, s: shared_prefix(r, d, s, LONG_SUFFIX),
    ),
}


# ------------------------------------------------------------------------------ cluster simulation


def sim_row(setup: Setup, workload: list[SimRequest], seed: int, scrape_interval: float = 0.05) -> dict[str, Any]:
    """One setup on one workload in the cluster simulation: latencies (ms), flow throughput, decisions."""
    router = setup.router(seed)
    report = run_cluster_sim(setup.pods(), workload, router, scrape_interval=scrape_interval, seed=seed)
    return _report_row(setup, report, workload, router)


def _report_row(setup: Setup, report: SimReport, workload: list[SimRequest], router: SchedulerRouter) -> dict:
    ok = [r for r in report.results if r.status == OK]
    req_s, tok_s = flow_throughput(((r.arrival + r.e2e, r.output_tokens) for r in ok),
                                   flow_window(r.arrival_time for r in workload))  # fmt: skip
    decisions = None
    if not setup.both:
        split = sum(1 for r in ok if r.prefill_pod is not None)
        decisions = {PD: split, DECODE_ONLY: len(ok) - split}
    return {
        "setup": setup.name,
        "requests": len(workload),
        "completed": len(ok),
        "failed": len(report.results) - len(ok),
        "ttft_ms": dist_ms(r.ttft for r in ok),
        "itl_ms": dist_ms(r.itl for r in ok if r.output_tokens > 1),
        "e2e_ms": dist_ms(r.e2e for r in ok),
        "throughput": req_s,
        "output_throughput": tok_s,
        "decisions": decisions,
        "preemptions": report.preemptions,
        "prefix_hit_rate": report.prefix_hit_rate,
        "errors": dict(list(router.errors.items())[:3]),
        "wall_s": report.wall_time_s,
    }


def calibrate(duration: float, seed: int) -> dict[str, Any]:
    """The aggregated 8-pod pool's capacity on the long-prompt workload, in requests/s.

    A burst of 50 requests per pod at t=0 gives a first estimate B (completions / makespan); then
    Poisson probes at PROBES x B for `duration` s each; the capacity is the highest flow throughput
    of a probe (the top of the throughput-vs-offered-load curve: past it the pool does not keep up,
    and its KV cache fills up and preempts)."""
    pods = AGGREGATED_8.pods()
    burst = run_cluster_sim(pods, long_prompts(0, 50 * len(pods), seed), AGGREGATED_8.router(seed), seed=seed)
    estimate = burst.request_throughput
    probes = []
    for f in PROBES:
        row = sim_row(AGGREGATED_8, long_prompts(f * estimate, duration, seed), seed)
        probes.append({"offered": f * estimate, "throughput": row["throughput"]})
    best = max(probes, key=lambda p: p["throughput"])
    offered = ", ".join(f"{p['offered']:.1f}" for p in probes)
    return {
        "request_rate": best["throughput"],
        "burst_estimate": estimate,
        "probes": probes,
        "method": (
            f"{AGGREGATED_8.name} pods, the default config: a burst of {50 * len(pods)} requests at t=0 completes "
            f"at {estimate:.1f} req/s; Poisson probes at {offered} req/s ({duration:g} s each); capacity = the "
            f"highest rate of completions between the 50th and 95th percentile of arrival times "
            f"({best['throughput']:.1f} req/s, offered {best['offered']:.1f})"
        ),
    }


def run_sim(quick: bool, seed: int = 0) -> dict[str, Any]:
    duration = 30.0 if quick else 60.0
    cal = calibrate(duration, seed)
    cap = cal["request_rate"]
    ladder = QUICK_LADDER if quick else LADDER
    plan = [("long-prompt", QUICK_SIM_SETUPS if quick else SIM_SETUPS)]
    plan += [(w, PREFIX_SETUPS) for w in ("shared-prefix-short", "shared-prefix-long")]
    runs = []
    for workload_name, setups in plan:
        make = WORKLOADS[workload_name][1]
        for k, fraction in enumerate(ladder):
            rate = fraction * cap
            workload = make(rate, duration, seed * 1000 + k)
            for setup in setups:
                row = sim_row(setup, workload, seed)
                runs.append({"workload": workload_name, "rate": rate, "fraction": fraction, **row})
                _log(f"sim {workload_name} {setup.name} @ {rate:.1f} req/s: {row['wall_s']:.1f} s")
    return {
        "benchmark": "pd-sim",
        "quick": quick,
        "seed": seed,
        "duration_s": duration,
        "capacity": cal,
        "workloads": {k: v[0] for k, v in WORKLOADS.items()},
        "runs": runs,
        "meta": _meta(),
    }


# ------------------------------------------------------------------------------------ end to end


def run_e2e(quick: bool, seed: int = 0, time_scale: float = 1.0, port: int = E2E_PORT,
            rates: Sequence[float] | None = None, setups: Sequence[Setup] = E2E_SETUPS) -> dict[str, Any]:  # fmt: skip
    """The E2E setups behind the real gateway, one Ray for the whole run (see the module doc)."""
    import psutil
    import ray

    from serve_app.cli.launch import _kill_leftovers, serve_fast_path_env

    rates = list(rates or ((4.0,) if quick else (2.0, 4.0, 6.0)))
    duration = 15.0 if quick else 30.0
    serve_fast_path_env()  # before Ray starts: Serve's processes inherit it
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=os.cpu_count() or 2, include_dashboard=False, log_to_driver=False,
             _node_ip_address="127.0.0.1", namespace="ray-epp-pd-bench")  # fmt: skip
    children = [p.pid for p in psutil.Process().children(recursive=True)]
    runs: list[dict[str, Any]] = []
    load = os.getloadavg()
    try:
        for setup in setups:
            runs += _e2e_setup(setup, rates, duration, seed, time_scale, port)
    finally:
        ray.shutdown()
        _kill_leftovers(children)
    return {
        "benchmark": "pd-e2e",
        "quick": quick,
        "seed": seed,
        "duration_s": duration,
        "time_scale": time_scale,
        "rates": rates,
        "load_average_at_start": load,
        "runs": runs,
        "meta": _meta(),
    }


def _e2e_setup(setup: Setup, rates: list[float], duration: float, seed: int, scale: float, port: int) -> list[dict]:
    from actors.launcher import PodSpec
    from bench.metrics import summarize
    from bench.replay_client import replay
    from ray_epp.simulator import start_sim_pods_in_thread
    from serve_app.cli.launch import EppDeployment, LaunchSpec

    out = []
    with start_sim_pods_in_thread(setup.pods(), time_scale=scale, seed=seed) as sim:
        specs = [PodSpec(name=p.name, address="127.0.0.1", port=p.port, labels=p.labels) for p in sim.pods]
        dep = EppDeployment.start(LaunchSpec(config=setup.config(), pods=specs, port=port))
        try:
            # Warm-up, not counted: 4 short and 4 long prompts; then the counters' push (every second).
            asyncio.run(replay([dep.url], long_prompts(2.0, 2, seed + 999), scale, 60.0, 4))
            time.sleep(2.5)
            for k, rate in enumerate(rates):
                workload = long_prompts(rate, duration, seed * 1000 + 100 + k)
                page = _metrics_page(dep.url)
                before, time_before = decision_counts(page), scheduler_time(page)
                t0 = time.perf_counter()
                outcomes, _ = asyncio.run(replay([dep.url], workload, scale, 120.0, 0))
                wall = time.perf_counter() - t0
                time.sleep(2.5)  # the gateway pushes its counters every second
                page = _metrics_page(dep.url)
                after, time_after = decision_counts(page), scheduler_time(page)
                m = summarize(outcomes)
                ok = [o for o in outcomes if o.status == OK]
                req_s, tok_s = flow_throughput(((o.finish, o.output_tokens) for o in ok),
                                               flow_window(r.arrival_time for r in workload))  # fmt: skip
                row = {
                    "setup": setup.name, "rate": rate, "source": "e2e", "requests": len(outcomes),
                    "completed": m["completed"], "failed": m["errors"] + m["shed"],
                    "ttft_ms": m["ttft_ms"], "itl_ms": m["itl_ms"], "e2e_ms": m["e2e_ms"],
                    "throughput": req_s, "output_throughput": tok_s,
                    "decisions": counts_delta(before, after) if not setup.both else None,
                    "prefix_hit_rate": m["prefix_hit_rate"], "wall_s": wall,
                    "decision_mean_ms": mean_ms(time_before, time_after),
                }  # fmt: skip
                predicted = sim_row(setup, workload, seed)
                out += [row, {**predicted, "rate": rate, "source": "sim"}]
                _log(f"e2e {setup.name} @ {rate:g} req/s: {m['completed']}/{len(outcomes)} ok in {wall:.0f} s")
        finally:
            dep.stop()
    return out


def _metrics_page(url: str) -> str:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        return resp.read().decode()


def _meta() -> dict[str, Any]:
    from bench.runner import _meta as runner_meta

    return runner_meta(" ".join(["python -m bench.pd_benchmark", *sys.argv[1:]]))


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _write(result: dict[str, Any], stem: str, markdown: str, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    scale = result.get("time_scale", 1)
    suffix = ("_quick" if result["quick"] else "") + (f"_ts{scale:g}" if scale != 1 else "")
    path = out / f"{stem}{suffix}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(markdown)
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.pd_benchmark", description=__doc__.split("\n\n")[0])
    p.add_argument("what", nargs="?", default="all", choices=("sim", "e2e", "all"))
    p.add_argument("--quick", action="store_true", help="fewer setups, rates and seconds (a smoke run)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--time-scale", type=float, default=1.0, help="e2e: wall seconds per model second")
    p.add_argument("--e2e-rates", help="e2e: comma-separated rates in req/s of model time (default 2,4,6)")
    p.add_argument("--port", type=int, default=E2E_PORT, help="e2e: the gateway's port")
    p.add_argument(
        "--rounds",
        action="store_true",
        help="e2e: 2P+2D in sequential rounds against one round (parallelStages), not aggregated vs P/D",
    )
    p.add_argument("--out", default=str(RESULTS_DIR))
    args = p.parse_args(argv)
    out = Path(args.out)
    if args.what in ("sim", "all"):
        result = run_sim(args.quick, args.seed)
        _write(result, "pd_sim", sim_markdown(result), out)
    if args.what in ("e2e", "all"):
        rates = [float(x) for x in args.e2e_rates.split(",")] if args.e2e_rates else None
        setups = E2E_ROUNDS_SETUPS if args.rounds else E2E_SETUPS
        result = run_e2e(args.quick, args.seed, args.time_scale, args.port, rates, setups)
        _write(result, "pd_e2e_rounds" if args.rounds else "pd_e2e", e2e_markdown(result), out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
