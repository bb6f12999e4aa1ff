"""The routing targets, checked on a sweep's result dict. Each verdict is
{"target", "policy", "passed": True | False | None (not measurable in this run), "detail"}.

"Peers" are every policy in the run that is not ours (`epp-…`): the real routers' algorithms and
the simple baselines alike, so "the best peer" is the best of all of them on that figure."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from bench.policies import is_ours

Verdict = dict[str, Any]

LOWER_IS_BETTER = (
    ("TTFT p50", ("ttft_ms", "p50")),
    ("TTFT p90", ("ttft_ms", "p90")),
    ("TTFT p99", ("ttft_ms", "p99")),
    ("ITL p50", ("itl_ms", "p50")),
    ("E2E p50", ("e2e_ms", "p50")),
    ("E2E p90", ("e2e_ms", "p90")),
    ("E2E p99", ("e2e_ms", "p99")),
)


def get(metrics: dict[str, Any], path: tuple[str, ...]) -> float:
    value: Any = metrics
    for key in path:
        value = value[key]
    return math.nan if value is None else float(value)


def rungs(result: dict[str, Any]) -> list[float]:
    return sorted({run["fraction"] for run in result["runs"]})


def at(result: dict[str, Any], fraction: float) -> dict[str, dict[str, Any]]:
    """policy -> metrics at one rung of the ladder."""
    return {r["policy"]: r["metrics"] for r in result["runs"] if r["fraction"] == fraction}


def nearest(result: dict[str, Any], fraction: float) -> float:
    return min(rungs(result), key=lambda f: (abs(f - fraction), f))


def peers(by_policy: dict[str, Any]) -> list[str]:
    return [p for p in by_policy if not is_ours(p)]


def _verdict(target: str, policy: str, passed: bool | None, detail: str) -> Verdict:
    return {"target": target, "policy": policy, "passed": passed, "detail": detail}


def _missing(target: str, policy: str, why: str) -> Verdict:
    return _verdict(target, policy, None, why)


def check_shared_prefix(result: dict[str, Any], ours: str = "epp-default") -> list[Verdict]:
    frac = nearest(result, result.get("near_saturation", 0.9))
    runs = at(result, frac)
    where = f"at {frac:g}x capacity"
    if ours not in runs:
        return [_missing("shared prefix", ours, f"{ours} was not run")]
    ps = peers(runs)
    me = runs[ours]
    out = []
    ttft = get(me, ("ttft_ms", "p90"))
    # the simulation's round-robin baseline, or end to end sglang-router's round_robin policy
    rr_name = next((n for n in ("round-robin", "sglang-round-robin") if n in runs), None)
    if rr_name is not None:
        rr = get(runs[rr_name], ("ttft_ms", "p90"))
        out.append(
            _verdict(
                "TTFT p90 <= 0.25x round-robin's",
                ours,
                ttft <= 0.25 * rr,
                f"{where}: {ttft:.0f} ms vs {rr:.0f} ms ({rr_name}) = {ttft / rr:.2f}x",
            )
        )
    else:
        out.append(_missing("TTFT p90 <= 0.25x round-robin's", ours, "round-robin was not run"))
    if ps:
        best = min(ps, key=lambda p: get(runs[p], ("ttft_ms", "p90")))
        b = get(runs[best], ("ttft_ms", "p90"))
        out.append(
            _verdict(
                "TTFT p90 <= 0.8x the best peer's",
                ours,
                ttft <= 0.8 * b,
                f"{where}: {ttft:.0f} ms vs {best} {b:.0f} ms = {ttft / b:.2f}x",
            )
        )
        top = max(ps, key=lambda p: runs[p]["output_throughput"])
        t_me, t_top = me["output_throughput"], runs[top]["output_throughput"]
        out.append(
            _verdict(
                "output throughput >= the best peer's",
                ours,
                t_me >= t_top,
                f"{where}: {t_me:,.0f} tok/s vs {top} {t_top:,.0f} tok/s = {t_me / t_top:.3f}x",
            )
        )
    return out


def check_multi_lora(result: dict[str, Any], ours: str = "epp-lora") -> list[Verdict]:
    out = []
    for name, path, fmt in (
        ("fewer adapter loads than every peer", ("lora_loads",), "{:.0f}"),
        ("lower TTFT p90 than every peer", ("ttft_ms", "p90"), "{:.0f} ms"),
    ):
        misses, details = [], []
        for frac in rungs(result):
            runs = at(result, frac)
            if ours not in runs or not peers(runs):
                return [_missing(name, ours, f"{ours} or the peers were not run")]
            mine = get(runs[ours], path)
            best = min(peers(runs), key=lambda p: get(runs[p], path))
            b = get(runs[best], path)
            details.append(f"{frac:g}x: {fmt.format(mine)} vs {best} {fmt.format(b)}")
            if not mine < b:
                misses.append(f"{frac:g}x")
        detail = "; ".join(details) + (f" (missed at {', '.join(misses)})" if misses else "")
        out.append(_verdict(name, ours, not misses, detail))
    return out


def check_overload(result: dict[str, Any], ours: str = "epp-default") -> list[Verdict]:
    fr = rungs(result)
    high, low = nearest(result, 1.5), nearest(result, 0.5)
    if high == low:
        return [_missing("overload", ours, "needs a rung near 0.5x and one near 1.5x capacity")]
    hi_runs, lo_runs = at(result, high), at(result, low)
    if ours not in hi_runs or ours not in lo_runs:
        return [_missing("overload", ours, f"{ours} was not run")]
    prio_hi = hi_runs[ours].get("by_priority") or {}
    prio_lo = lo_runs[ours].get("by_priority") or {}
    crit_hi, shed_hi = prio_hi.get("1"), prio_hi.get("-1")
    if crit_hi is None or shed_hi is None or "1" not in prio_lo:
        return [_missing("overload", ours, "the workload has no critical/sheddable mix")]
    crit_lost = crit_hi["shed"] + crit_hi["errors"]
    first = crit_lost == 0 and shed_hi["shed"] > 0
    out = [
        _verdict(
            "sheddable requests are shed first",
            ours,
            first,
            f"at {high:g}x: {shed_hi['shed']}/{shed_hi['requests']} sheddable shed, "
            f"{crit_lost}/{crit_hi['requests']} critical shed or failed",
        )
    ]
    t_hi, t_lo = crit_hi["ttft_ms"]["p90"], prio_lo["1"]["ttft_ms"]["p90"]
    ok = not math.isnan(t_hi) and t_hi <= 2 * t_lo
    out.append(
        _verdict(
            f"critical TTFT p90 at {high:g}x <= 2x its value at {low:g}x",
            ours,
            ok,
            f"{t_hi:.0f} ms vs {t_lo:.0f} ms = {t_hi / t_lo:.2f}x",
        )
    )
    if len(fr) > 2:
        mid = [f for f in fr if low < f < high]
        for f in mid:
            c = (at(result, f).get(ours, {}).get("by_priority") or {}).get("1")
            if c:
                out.append(
                    _verdict(
                        f"(info) critical TTFT p90 at {f:g}x",
                        ours,
                        None,
                        f"{c['ttft_ms']['p90']:.0f} ms, {c['shed'] + c['errors']} critical shed or failed",
                    )
                )
    return out


def check_uniform(result: dict[str, Any], ours: str = "epp-default", tolerance: float = 0.05) -> list[Verdict]:
    out = []
    figures: list[tuple[str, Callable[[dict[str, Any]], float], bool]] = [
        (name, (lambda m, p=path: get(m, p)), True) for name, path in LOWER_IS_BETTER
    ]
    figures.append(("output throughput", lambda m: m["output_throughput"], False))
    for name, value, lower in figures:
        misses, worst = [], 0.0
        for frac in rungs(result):
            runs = at(result, frac)
            if ours not in runs or not peers(runs):
                return [_missing("uniform", ours, f"{ours} or the peers were not run")]
            mine = value(runs[ours])
            vals = {p: value(runs[p]) for p in peers(runs)}
            best = min(vals, key=vals.get) if lower else max(vals, key=vals.get)
            ratio = mine / vals[best] if vals[best] else math.inf
            off = ratio - 1 if lower else 1 - ratio
            worst = max(worst, off)
            if off > tolerance:
                misses.append(f"{frac:g}x: {mine:,.1f} vs {best} {vals[best]:,.1f} ({off:+.1%})")
        detail = "; ".join(misses) if misses else f"worst {worst:+.1%} against the best peer"
        out.append(_verdict(f"{name} within {tolerance:.0%} of the best peer", ours, not misses, detail))
    return out


CHECKS: dict[str, Callable[[dict[str, Any]], list[Verdict]]] = {
    "shared-prefix": check_shared_prefix,
    "multi-lora": check_multi_lora,
    "overload": lambda result: [
        *check_overload(result),
        # ray_epp/configs/priority.yaml, written for mixed-priority pools, is held to the target when it ran
        *(check_overload(result, "epp-priority") if "epp-priority" in result.get("policies", ()) else []),
    ],
    "uniform": check_uniform,
}


def check(result: dict[str, Any]) -> list[Verdict]:
    fn = CHECKS.get(result.get("target", ""))
    return fn(result) if fn else []
