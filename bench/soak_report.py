"""The soak's report (bench/soak.py): every request counted in the window of the fault that holds
its completion (60 s from the fault, plus a pod's down or hung time), the fault-free rest, and the
memory and structure-size summaries of what was sampled (bench/soak_sampling.py)."""

from __future__ import annotations

import os
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from bench.soak_faults import held_by_lost_replica
from bench.soak_sampling import process_summary, size_summary

if TYPE_CHECKING:
    from bench.soak import Result, SoakConfig
    from bench.soak_faults import Fault
    from bench.soak_tracemalloc import TracemallocProbe


class SoakReport:
    """The reporting part of `Soak` (its base): reads its results, faults, samples and probe."""

    cfg: SoakConfig
    results: list[Result]
    faults: list[Fault]
    samples: list[dict[str, Any]]
    skipped: int
    probe: TracemallocProbe | None

    def report(self, model_capacity: float, measured: float | None, rate: float, seconds: float) -> dict[str, Any]:
        res = self.results
        windows = []
        for i, f in enumerate(self.faults):
            end = self.faults[i + 1].t if i + 1 < len(self.faults) else seconds
            end = min(end, f.t + 60.0 + (f.back_t - f.t if f.back_t else 0.0))
            # by completion: a request in flight on a killed replica was sent before the fault
            inside = [r for r in res if f.t <= r.t + r.latency_s < end]
            bad = [r for r in inside if r.status != 200]
            held = [r for r in bad if held_by_lost_replica(f, r.error, r.t + r.latency_s)]
            windows.append({
                **asdict(f),
                "window_s": round(end - f.t, 1),
                "requests": len(inside),
                "failed": len(bad),
                "held_by_lost_replica": len(held),
                "failed_by": _count(_kind(r) for r in bad),
                "last_failure_after_s": round(max(r.t for r in bad) - f.t, 1) if bad else None,
            })  # fmt: skip
        fault_free = [r for r in res if not any(w["t"] <= r.t + r.latency_s < w["t"] + w["window_s"] for w in windows)]
        ok = sorted(r.latency_s for r in res if r.status == 200)
        return {
            "config": {k: v for k, v in asdict(self.cfg).items()},
            "load_average": os.getloadavg(),
            "capacity": {"engine_model_rps": round(model_capacity, 2), "measured_rps": measured and round(measured, 2)},
            "rate_rps": round(rate, 2),
            "seconds": seconds,
            "sent": len(res),
            "ok": len(ok),
            "failed": len(res) - len(ok),
            "failed_by": _count(_kind(r) for r in res if r.status != 200),
            "held_by_lost_replica": sum(w["held_by_lost_replica"] for w in windows),
            "skipped_outstanding_cap": self.skipped,
            "fault_free": {"sent": len(fault_free), "failed": sum(1 for r in fault_free if r.status != 200)},
            "latency_ok_s": {"p50": _pct(ok, 0.5), "p99": _pct(ok, 0.99), "max": ok[-1] if ok else None},
            "faults": windows,
            "failures": [asdict(r) for r in res if r.status != 200][:2000],
            "processes": process_summary(self.samples),
            "sizes": size_summary(self.samples),
            "samples": self.samples,
            **({"tracemalloc": self.probe.rows} if self.probe is not None else {}),
        }


def _kind(r: Result) -> str:
    return str(r.status) if r.status else (r.error or "no answer")


def _count(items: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for i in items:
        out[i] = out.get(i, 0) + 1
    return out


def _pct(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    return round(sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))], 4)
