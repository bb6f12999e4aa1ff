"""The P/D benchmark's figures (bench/pd_benchmark.py), from what a run collected: throughput while
arrivals are in full flow, the gateway's P/D decisions and scheduling time read from its /metrics
page, and the Markdown tables. Pure functions, no Ray and no pods, so they are tested on their own."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from ray_epp.simulator.report import percentile

PD, DECODE_ONLY = "pd", "decode-only"  # the gateway's P/D decisions, as the tables count them


# ------------------------------------------------------------------------------------- pure figures


def flow_window(arrivals: Iterable[float]) -> tuple[float, float]:
    """The span while arrivals are in full flow: the 50th to 95th percentile of arrival times (the
    pool has filled up, and the tail's last arrivals are left out), as bench/runner.py probes."""
    times = sorted(arrivals)
    return percentile(times, 50), percentile(times, 95)


def flow_throughput(finished: Iterable[tuple[float, int]], window: tuple[float, float]) -> tuple[float, float]:
    """(requests/s, output tokens/s) completed inside `window`, from (finish time, output tokens).
    Past saturation this is what the pool sustains, not the offered rate."""
    lo, hi = window
    if hi <= lo:
        return math.nan, math.nan
    inside = [tokens for t, tokens in finished if lo <= t <= hi]
    return len(inside) / (hi - lo), sum(inside) / (hi - lo)


def decision_counts(metrics_text: str) -> dict[str, float]:
    """The gateway's P/D hand-offs (`ray_epp_pd_handoffs_total{outcome="..."}`) from a Prometheus
    page: pd (a prefill ran, or was tried and fell back: `pd-fallback`) and decode-only."""
    out: dict[str, float] = {}
    for line in metrics_text.splitlines():
        if line.startswith("ray_epp_pd_handoffs_total{") and 'outcome="' in line:
            label = line.split('outcome="', 1)[1].split('"', 1)[0]
            label = PD if label == "pd-fallback" else label
            if label in (PD, DECODE_ONLY):
                out[label] = out.get(label, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def scheduler_time(metrics_text: str) -> tuple[float, float]:
    """The gateway's scheduling time so far: inference_extension_scheduler_e2e_duration_seconds'
    (_sum in seconds, _count), summed over its label sets."""
    total = count = 0.0
    for line in metrics_text.splitlines():
        if line.startswith("inference_extension_scheduler_e2e_duration_seconds_sum"):
            total += float(line.rsplit(" ", 1)[1])
        elif line.startswith("inference_extension_scheduler_e2e_duration_seconds_count"):
            count += float(line.rsplit(" ", 1)[1])
    return total, count


def mean_ms(before: tuple[float, float], after: tuple[float, float]) -> float | None:
    """The mean of what a (_sum, _count) pair gained between two reads, in ms."""
    n = after[1] - before[1]
    return None if n <= 0 else (after[0] - before[0]) / n * 1000


def counts_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, int]:
    return {k: round(after.get(k, 0.0) - before.get(k, 0.0)) for k in sorted(set(before) | set(after))}


# --------------------------------------------------------------------------------------- reports


def _f(x: float | None, fmt: str = "{:,.0f}") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)


def _decisions(d: dict[str, int] | None) -> str:
    return "-" if d is None else f"{d.get(PD, 0)} / {d.get(DECODE_ONLY, 0)}"


HEADER = (
    "| rate (req/s) | setup | TTFT p50 | TTFT p90 | ITL p50 | ITL p90 | E2E p50 | E2E p90 | done req/s "
    "| out tok/s | P/D: pd / decode-only | preempt. |\n"
    "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def _row_line(run: dict[str, Any], label: str) -> str:
    t, i, e = run["ttft_ms"], run["itl_ms"], run["e2e_ms"]
    failed = f" ({run['failed']} failed)" if run.get("failed") else ""
    return (
        f"| {label} | {run['setup']}{failed} | {_f(t['p50'])} | {_f(t['p90'])} | {_f(i['p50'], '{:.1f}')} "
        f"| {_f(i['p90'], '{:.1f}')} | {_f(e['p50'] / 1000, '{:.2f}')} | {_f(e['p90'] / 1000, '{:.2f}')} "
        f"| {_f(run['throughput'], '{:.1f}')} | {_f(run['output_throughput'])} | {_decisions(run['decisions'])} "
        f"| {_f(run.get('preemptions'))} |"
    )


def sim_markdown(result: dict[str, Any]) -> str:
    cap = result["capacity"]
    parts = [
        f"Cluster simulation, {result['duration_s']:g} s of arrivals per rate, seed {result['seed']}. "
        f"Capacity of the aggregated 8-pod pool: **{cap['request_rate']:.1f} req/s** ({cap['method']}).",
        "",
        "TTFT and ITL in ms, E2E in s; ITL is each request's mean gap between tokens; *done req/s* and "
        "*out tok/s* count completions while arrivals are in full flow (50th-95th percentile of arrival times).",
    ]
    for name, description in result["workloads"].items():
        runs = [r for r in result["runs"] if r["workload"] == name]
        if not runs:
            continue
        parts += ["", f"**{name}** — {description}:", "", HEADER]
        parts += [_row_line(r, f"{r['rate']:.1f} ({r['fraction']:g}x)") for r in runs]
    return "\n".join(parts) + "\n"


def e2e_markdown(result: dict[str, Any]) -> str:
    load = ", ".join(f"{x:.1f}" for x in result["load_average_at_start"])
    parts = [
        f"End to end: the gateway on Ray Serve in front of real-time simulated pods, time scale "
        f"{result['time_scale']:g} (latencies in model time = wall time / scale), {result['duration_s']:g} model "
        f"seconds of arrivals per rate, streaming; load average at start {load}. Each *e2e* row is followed by "
        "the cluster simulation of the same workload on the same pods (*sim*: the prediction).",
        "",
        HEADER.replace("| setup |", "| setup, source |"),
    ]
    for r in result["runs"]:
        parts.append(_row_line({**r, "setup": f"{r['setup']}, {r['source']}"}, f"{r['rate']:g}"))
    decided = [r for r in result["runs"] if r.get("decision_mean_ms") is not None]
    if decided:
        held = "; ".join(f"{r['setup']} @ {r['rate']:g}: {r['decision_mean_ms']:.2f}" for r in decided)
        parts += [
            "",
            f"The gateway's mean scheduling time per request (wall ms, from its scheduler e2e histogram): {held}",
        ]
    return "\n".join(parts) + "\n"
