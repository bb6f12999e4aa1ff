"""SLO attainment in the cluster simulation: unique prompts (the uniform scenario's),
every third request carrying a tight TTFT target in `x-slo-ttft-ms`, the rest none.

For each policy and rate: **attainment** = the share of SLO-carrying requests whose TTFT met the
target (a refused or failed one did not), and **goodput** = requests per second that succeeded and
met their target (a request without one counts when it succeeded), over the arrival window.
Rates are fractions of the uniform scenario's calibrated capacity (round-robin's), measured in the
same run unless `--capacity` is given.

    python -m bench.slo_attainment [--rates 0.7,0.9,1.1] [--duration 20] [--slo-ms 75]
        [--policies epp-slo,epp-default,sglang-cache-aware]
"""

from __future__ import annotations

import argparse
import json
import math
import os
from typing import Any

from bench.drivers import ClusterSimDriver
from bench.metrics import Outcome
from bench.runner import calibrate
from bench.scenarios import SCENARIOS
from ray_epp.simulator import SimRequest
from ray_epp.simulator.report import OK

SLO_HEADER = "x-slo-ttft-ms"
DEFAULT_POLICIES = ("epp-slo", "epp-default", "sglang-cache-aware")


def slo_workload(rate: float, seed: int, duration_s: float, slo_ms: float, every: int = 3) -> list[SimRequest]:
    """The uniform scenario's requests at `rate`, every `every`-th carrying `x-slo-ttft-ms`."""
    scenario = SCENARIOS["uniform"]
    requests = scenario.workload(rate, seed, max(1, math.ceil(rate * duration_s)))
    for i, r in enumerate(requests):
        if i % every == 0:
            r.headers = {**r.headers, SLO_HEADER: f"{slo_ms:g}"}
    return requests


def attainment(outcomes: list[Outcome], workload: list[SimRequest], slo_ms: float) -> dict[str, Any]:
    carrying = {r.request_id for r in workload if SLO_HEADER in r.headers}
    met = good = 0
    for o in outcomes:
        ok = o.status == OK
        if o.request_id in carrying:
            hit = ok and o.ttft * 1000.0 <= slo_ms
            met += hit
            good += hit
        else:
            good += ok
    span = max(r.arrival_time for r in workload) - min(r.arrival_time for r in workload) if workload else 0.0
    return {
        "slo_requests": len(carrying),
        "attainment": met / len(carrying) if carrying else math.nan,
        "goodput_rps": good / span if span > 0 else math.nan,
    }


def run(
    policies: list[str], fractions: list[float], duration_s: float, slo_ms: float, capacity: float | None, seed: int
) -> dict[str, Any]:
    scenario = SCENARIOS["uniform"]
    if capacity is None:
        capacity = calibrate(scenario, seed=seed)["request_rate"]
    driver = ClusterSimDriver()
    rows = []
    for fraction in fractions:
        rate = fraction * capacity
        workload = slo_workload(rate, seed, duration_s, slo_ms)
        for policy in policies:
            result = driver.run(policy, scenario.pods(), workload, seed)
            figures = attainment(result.outcomes, workload, slo_ms)
            ttft = result.metrics.get("ttft_ms", {})
            rows.append({
                "fraction": fraction, "rate": rate, "policy": policy, **figures,
                "ttft_p90_ms": ttft.get("p90", math.nan),
                "decision_us_p50": result.metrics["route_us"].get("p50", math.nan),
            })  # fmt: skip
    return {"capacity_rps": capacity, "slo_ms": slo_ms, "duration_s": duration_s, "rows": rows, "load": os.getloadavg()}


def table(result: dict[str, Any]) -> str:
    lines = [
        "| x cap | rate (req/s) | policy | attainment | goodput (req/s) | TTFT p90 (ms) | decision µs p50 |",
        "|---:|---:|---|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['fraction']:.1f} | {r['rate']:.1f} | {r['policy']} | {r['attainment'] * 100:.1f}% | "
            f"{r['goodput_rps']:.1f} | {r['ttft_p90_ms']:.0f} | {r['decision_us_p50']:.0f} |"
        )
    return "\n".join(lines)


def verdicts(result: dict[str, Any], ours: str = "epp-slo") -> list[str]:
    """The targets: >= 95% at 0.9x; >= 1.5x the best peer's attainment at 1.1x."""
    out = []
    by = {(r["fraction"], r["policy"]): r for r in result["rows"]}
    if (0.9, ours) in by:
        a = by[(0.9, ours)]["attainment"]
        out.append(f"{'met' if a >= 0.95 else 'missed'}: attainment at 0.9x {a * 100:.1f}% (target >= 95%)")
    # Peers: today's default and the other routers; variants of ours (epp-slo-*) are ablations.
    peers = [r for (f, p), r in by.items() if f == 1.1 and p != ours and not p.startswith(ours + "-")]
    if (1.1, ours) in by and peers:
        best = max(peers, key=lambda r: r["attainment"])
        a = by[(1.1, ours)]["attainment"]
        ratio = a / best["attainment"] if best["attainment"] > 0 else math.inf
        out.append(
            f"{'met' if ratio >= 1.5 else 'missed'}: attainment at 1.1x {a * 100:.1f}% = {ratio:.2f}x the best "
            f"peer's ({best['policy']}, {best['attainment'] * 100:.1f}%; target >= 1.5x)"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.slo_attainment", description=__doc__.split("\n\n")[0])
    parser.add_argument("--policies", default=",".join(DEFAULT_POLICIES))
    parser.add_argument("--rates", default="0.7,0.9,1.1", help="fractions of the calibrated capacity")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of arrivals per rate")
    parser.add_argument("--slo-ms", type=float, default=75.0, help="the TTFT target the SLO third carries")
    parser.add_argument("--capacity", type=float, help="skip the calibration: the pool's capacity in req/s")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args(argv)
    result = run(
        args.policies.split(","), [float(f.rstrip("x")) for f in args.rates.split(",")], args.duration,
        args.slo_ms, args.capacity, args.seed,
    )  # fmt: skip
    print(f"capacity {result['capacity_rps']:.1f} req/s, SLO {args.slo_ms:g} ms on every third request, "
          f"{args.duration:g} s per rate, load average {' '.join(f'{x:.2f}' for x in result['load'])}")  # fmt: skip
    print(table(result))
    for line in verdicts(result):
        print("*", line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
