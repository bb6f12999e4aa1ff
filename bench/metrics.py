"""Per-request outcomes and the figures a benchmark run reports, the same for every driver.

A driver (the cluster simulation today, an HTTP load generator against real routers later) turns
each request into an `Outcome`; `summarize` makes the run's figures from them. Latencies are in
seconds in outcomes and in milliseconds in the summary."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ray_epp.simulator.report import percentile

OK, SHED, ERROR = "ok", "shed", "error"


@dataclass(slots=True)
class Outcome:
    request_id: str
    status: str  # ok | shed (refused by admission: 429) | error (refused or failed otherwise)
    arrival: float
    priority: int = 0
    model: str = ""
    ttft: float = math.nan
    itl: float = math.nan  # this request's mean inter-token latency
    e2e: float = math.nan
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    # Why a request is not ok, so a run can split its failures: a short key to count by (e.g.
    # "http 503 ServiceUnavailable", "stream cut: ClientPayloadError", "unfinished at cut-off
    # (streaming)") and the answer's own words (the gateway's message, how long it took).
    reason: str = ""
    detail: str = ""

    @property
    def finish(self) -> float:
        return self.arrival + self.e2e


def dist_ms(values: Iterable[float], quantiles: Sequence[int] = (50, 90, 99)) -> dict[str, float]:
    """Percentiles and mean in milliseconds; NaN when there are no values."""
    v = sorted(x for x in values if not math.isnan(x))
    out = {f"p{q}": percentile(v, q) * 1000 if v else math.nan for q in quantiles}
    out["mean"] = sum(v) / len(v) * 1000 if v else math.nan
    return out


def summarize(outcomes: list[Outcome], duration: float | None = None) -> dict[str, Any]:
    """The run's figures. `duration` (first arrival to last completion) is computed when None."""
    ok = [o for o in outcomes if o.status == OK]
    if duration is None:
        start = min((o.arrival for o in outcomes), default=0.0)
        duration = max((o.finish for o in ok), default=start) - start
    prompt = sum(o.prompt_tokens for o in ok)
    out: dict[str, Any] = {
        "requests": len(outcomes),
        "completed": len(ok),
        "shed": sum(1 for o in outcomes if o.status == SHED),
        "errors": sum(1 for o in outcomes if o.status == ERROR),
        "duration_s": duration,
        "ttft_ms": dist_ms(o.ttft for o in ok),
        "itl_ms": dist_ms(o.itl for o in ok if o.output_tokens > 1),
        "e2e_ms": dist_ms(o.e2e for o in ok),
        "request_throughput": len(ok) / duration if duration > 0 else 0.0,
        "output_throughput": sum(o.output_tokens for o in ok) / duration if duration > 0 else 0.0,
        "prefix_hit_rate": sum(o.cached_tokens for o in ok) / prompt if prompt else 0.0,
    }
    priorities = sorted({o.priority for o in outcomes})
    if len(priorities) > 1:
        out["by_priority"] = {str(p): _class_figures([o for o in outcomes if o.priority == p]) for p in priorities}
    return out


def _class_figures(outcomes: list[Outcome]) -> dict[str, Any]:
    ok = [o for o in outcomes if o.status == OK]
    return {
        "requests": len(outcomes),
        "completed": len(ok),
        "shed": sum(1 for o in outcomes if o.status == SHED),
        "errors": sum(1 for o in outcomes if o.status == ERROR),
        "ttft_ms": dist_ms(o.ttft for o in ok),
        "e2e_ms": dist_ms(o.e2e for o in ok),
    }


def steady_throughput(outcomes: list[Outcome], lo: float = 0.2, hi: float = 0.8) -> float:
    """Completions per second between the `lo` and `hi` quantiles of completion time: the rate
    a pool sustains once a burst has filled it and before it drains."""
    times = sorted(o.finish for o in outcomes if o.status == OK)
    if len(times) < 10:
        raise ValueError("too few completed requests to measure a throughput")
    a, b = int(lo * (len(times) - 1)), int(hi * (len(times) - 1))
    span = times[b] - times[a]
    if span <= 0:
        raise ValueError("the completions are not spread in time: the burst is too small to measure a throughput")
    return (b - a) / span
