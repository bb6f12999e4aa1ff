"""A sweep: calibrate the pool's capacity, then run every policy at every rate of the ladder.

The result is a plain dict (what bench/results/<scenario>.json holds); the report writer and the
target checks read only that."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.drivers import ClusterSimDriver, Driver
from bench.metrics import OK, steady_throughput
from bench.scenarios import NEAR_SATURATION, Scenario
from ray_epp.simulator.report import percentile

CALIBRATION_POLICY = "round-robin"
PROBE_FRACTIONS = (0.6, 0.8, 1.0, 1.2)
ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True, slots=True)
class RateSpec:
    """A rate as a fraction of the calibrated capacity ("0.9x") or in requests per second ("40")."""

    value: float
    relative: bool

    @classmethod
    def parse(cls, text: str) -> RateSpec:
        t = text.strip().lower()
        relative = t.endswith("x")
        try:
            value = float(t[:-1] if relative else t)
        except ValueError:
            raise ValueError(
                f"a rate is a number of requests/s (40) or a fraction of capacity (0.9x), not {text!r}"
            ) from None
        if value <= 0:
            raise ValueError(f"a rate must be > 0, got {text!r}")
        return cls(value, relative)

    def resolve(self, capacity: float) -> tuple[float, float]:
        """(fraction of capacity, requests per second)."""
        if self.relative:
            return self.value, self.value * capacity
        return self.value / capacity, self.value


def calibrate(scenario: Scenario, driver: Driver | None = None, seed: int = 0) -> dict[str, Any]:
    """The pool's capacity in requests/s: the most round-robin gets through it.

    1. A burst: `CALIBRATION_REQUESTS_PER_POD` requests per pod at t=0; their completion rate
       between the 20th and 80th percentile of completion times is a first estimate B.
    2. Probes: Poisson arrivals at `PROBE_FRACTIONS` x B, each for the scenario's duration; a
       probe's throughput is its rate of completions while arrivals are in full flow (see
       `_probe`). The capacity is the highest probe throughput — the top of the
       throughput-vs-offered-load curve; past it, the pool does not keep up (and under KV-cache
       pressure, preemptions make it do less). While the highest-rate probe is also the best one
       (the curve still rises), probes continue at 1.2x its rate (at most 3 more). When the best
       probe kept up (>= 95% of its offered rate) and the next higher one did not, one more probe
       halfway between them."""
    driver = driver or ClusterSimDriver()
    pods = scenario.pods()
    burst = scenario.calibration_burst(len(pods), seed)
    estimate = steady_throughput(driver.run(CALIBRATION_POLICY, pods, burst, seed).outcomes)
    offered = [f * estimate for f in PROBE_FRACTIONS]
    probes: list[dict[str, float]] = []
    while offered:
        rate = offered.pop(0)
        probes.append(_probe(scenario, driver, pods, rate, seed))
        rising = max(probes, key=lambda p: p["throughput"]) is probes[-1]
        if not offered and rising and len(probes) < len(PROBE_FRACTIONS) + 3:
            offered.append(1.2 * rate)
    best = max(probes, key=lambda p: p["throughput"])
    higher = [p["offered"] for p in probes if p["offered"] > best["offered"]]
    if best["throughput"] >= 0.95 * best["offered"] and higher:  # the peak is between two probes: one more
        probes.append(_probe(scenario, driver, pods, (best["offered"] + min(higher)) / 2, seed))
        best = max(probes, key=lambda p: p["throughput"])
    rates = ", ".join(f"{p['offered']:.0f}" for p in sorted(probes, key=lambda p: p["offered"]))
    return {
        "request_rate": best["throughput"],
        "method": (
            f"round-robin at Poisson rates of {rates} req/s "
            f"({scenario.duration_s:g} s each): the highest rate of completions between the 50th and 95th "
            f"percentile of arrival times (offered {best['offered']:.0f}); first estimate from a burst of "
            f"{len(burst)} requests at t=0: {estimate:.0f} req/s"
        ),
        "burst_estimate": estimate,
        "probes": probes,
    }


def _probe(scenario: Scenario, driver: Driver, pods: list[Any], rate: float, seed: int) -> dict[str, float]:
    """Round-robin at `rate`: completions per second while arrivals are in full flow — between the
    50th and 95th percentile of arrival times (for Poisson arrivals, the second half of the window
    less its last 5%; multi-turn sessions arrive with a ramp and a tail, which this leaves out)."""
    workload = scenario.run_workload(rate, seed)
    times = sorted(r.arrival_time for r in workload)
    lo, hi = percentile(times, 50), percentile(times, 95)
    run = driver.run(CALIBRATION_POLICY, pods, workload, seed)
    done = sum(1 for o in run.outcomes if o.status == OK and lo <= o.finish <= hi)
    return {"offered": rate, "throughput": done / (hi - lo)}


def run_sweep(
    scenario: Scenario,
    policies: Sequence[str] | None = None,
    rates: Sequence[RateSpec] | None = None,
    *,
    driver: Driver | None = None,
    seed: int = 0,
    capacity: float | None = None,
    progress: bool = True,
    command: str = "",
    calibration_driver: Driver | None = None,
) -> dict[str, Any]:
    """Every policy at every rate, on the same seeded workload per rate. Returns the result dict.
    The capacity is calibrated with `calibration_driver` (default: `driver`) unless given."""
    driver = driver or ClusterSimDriver()
    if scenario.check_available is not None:
        scenario.check_available()
    policies = list(policies or scenario.policies)
    if capacity is None:
        cal = calibrate(scenario, calibration_driver or driver, seed)
        cal["driver"] = (calibration_driver or driver).name
    else:
        cal = {"request_rate": capacity, "method": "given on the command line"}
    cap = cal["request_rate"]
    ladder = sorted({spec.resolve(cap) for spec in (rates or [RateSpec(f, True) for f in scenario.fractions])})
    pods = scenario.pods()
    runs: list[dict[str, Any]] = []
    bar = _progress(len(ladder) * len(policies), scenario.name, progress)
    try:
        for fraction, rate in ladder:
            workload = scenario.run_workload(rate, seed)
            for policy in policies:
                bar.set_postfix_str(f"{policy} @ {rate:.1f} req/s")
                result = driver.run(policy, pods, workload, seed)
                runs.append(
                    {"policy": policy, "fraction": fraction, "rate": rate, "metrics": result.metrics, **result.extra}
                )
                bar.update(1)
    finally:
        bar.close()
    return {
        "scenario": scenario.name,
        "title": scenario.title,
        "description": scenario.description,
        "driver": driver.name,
        "target": scenario.target,
        "seed": seed,
        "pods": len(pods),
        "capacity": cal,
        "near_saturation": NEAR_SATURATION,
        "duration_s": scenario.duration_s,
        "policies": policies,
        "ladder": [{"fraction": f, "rate": r} for f, r in ladder],
        "runs": runs,
        "meta": _meta(command),
    }


def _progress(total: int, desc: str, enabled: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="run", disable=not enabled, dynamic_ncols=True)


def _meta(command: str) -> dict[str, Any]:
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=5
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return {
        "command": command,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "git_commit": commit,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }
