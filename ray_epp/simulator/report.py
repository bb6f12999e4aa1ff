"""Per-request results and aggregate reports of a cluster simulation."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

OK, DROPPED, REJECTED = "ok", "dropped", "rejected"


@dataclass(slots=True)
class RequestResult:
    """One request's outcome; latencies in seconds from its arrival (NaN when it did not run)."""

    request_id: str
    model: str
    status: str  # ok | dropped (the router shed it) | rejected (the pod refused it)
    arrival: float
    pod: str | None = None  # the pod that decoded (or did everything)
    prefill_pod: str | None = None  # set when the request was split P/D
    ttft: float = math.nan
    e2e: float = math.nan
    itl: float = math.nan  # mean inter-token latency of this request
    queue_wait: float = math.nan  # arrival -> first scheduled
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens served from the prefix cache (of the prefill pod for P/D)
    output_tokens: int = 0
    preemptions: int = 0
    lora_loaded: bool = False  # its admission loaded the adapter
    error: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}  # type: ignore[attr-defined]


@dataclass(slots=True)
class Dist:
    p50: float
    p90: float
    p99: float
    mean: float
    max: float
    count: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Dist:
        v = sorted(x for x in values if not math.isnan(x))
        if not v:
            return cls(math.nan, math.nan, math.nan, math.nan, math.nan, 0)
        return cls(percentile(v, 50), percentile(v, 90), percentile(v, 99), sum(v) / len(v), v[-1], len(v))

    def to_dict(self) -> dict[str, float]:
        return {"p50": self.p50, "p90": self.p90, "p99": self.p99, "mean": self.mean, "max": self.max}


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (q in 0..100) of an ascending sequence."""
    if not sorted_values:
        return math.nan
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


@dataclass(slots=True)
class PodStats:
    name: str
    requests: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    lora_loads: int = 0
    preemptions: int = 0
    evictions: int = 0
    steps: int = 0
    busy_time: float = 0.0


@dataclass(slots=True)
class SimReport:
    results: list[RequestResult]
    pods: list[PodStats]
    duration: float  # first arrival -> last completion, virtual seconds
    wall_time_s: float = 0.0
    ttft: Dist = field(init=False)
    itl: Dist = field(init=False)
    e2e: Dist = field(init=False)
    queue_wait: Dist = field(init=False)

    def __post_init__(self) -> None:
        ok = [r for r in self.results if r.status == OK]
        self.ttft = Dist.of([r.ttft for r in ok])
        self.itl = Dist.of([r.itl for r in ok if r.output_tokens > 1])
        self.e2e = Dist.of([r.e2e for r in ok])
        self.queue_wait = Dist.of([r.queue_wait for r in ok])

    @property
    def completed(self) -> int:
        return sum(1 for r in self.results if r.status == OK)

    @property
    def dropped(self) -> int:
        return sum(1 for r in self.results if r.status == DROPPED)

    @property
    def rejected(self) -> int:
        return sum(1 for r in self.results if r.status == REJECTED)

    @property
    def output_tokens(self) -> int:
        return sum(r.output_tokens for r in self.results if r.status == OK)

    @property
    def request_throughput(self) -> float:
        return self.completed / self.duration if self.duration > 0 else 0.0

    @property
    def output_token_throughput(self) -> float:
        return self.output_tokens / self.duration if self.duration > 0 else 0.0

    @property
    def prefix_hit_rate(self) -> float:
        """Prompt tokens served from the prefix cache / prompt tokens, over completed requests."""
        prompt = sum(r.prompt_tokens for r in self.results if r.status == OK)
        return sum(r.cached_tokens for r in self.results if r.status == OK) / prompt if prompt else 0.0

    @property
    def lora_loads(self) -> int:
        return sum(p.lora_loads for p in self.pods)

    @property
    def preemptions(self) -> int:
        return sum(p.preemptions for p in self.pods)

    def summary(self) -> dict[str, Any]:
        return {
            "requests": len(self.results),
            "completed": self.completed,
            "dropped": self.dropped,
            "rejected": self.rejected,
            "duration_s": self.duration,
            "request_throughput": self.request_throughput,
            "output_token_throughput": self.output_token_throughput,
            "prefix_hit_rate": self.prefix_hit_rate,
            "lora_loads": self.lora_loads,
            "preemptions": self.preemptions,
            "ttft_s": self.ttft.to_dict(),
            "itl_s": self.itl.to_dict(),
            "e2e_s": self.e2e.to_dict(),
            "queue_wait_s": self.queue_wait.to_dict(),
            "wall_time_s": self.wall_time_s,
        }

    def format(self) -> str:
        """A short human-readable table."""
        lines = [
            f"requests {len(self.results)}  completed {self.completed}  dropped {self.dropped}  "
            f"rejected {self.rejected}  duration {self.duration:.2f}s  wall {self.wall_time_s:.2f}s",
            f"throughput {self.request_throughput:.2f} req/s  {self.output_token_throughput:.0f} tok/s  "
            f"prefix hit rate {self.prefix_hit_rate:.3f}  lora loads {self.lora_loads}  "
            f"preemptions {self.preemptions}",
            f"{'':12}{'p50':>10}{'p90':>10}{'p99':>10}{'mean':>10}",
        ]
        for name, d in (("ttft", self.ttft), ("itl", self.itl), ("e2e", self.e2e), ("queue", self.queue_wait)):
            lines.append(f"{name + ' (ms)':12}" + "".join(f"{x * 1000:>10.1f}" for x in (d.p50, d.p90, d.p99, d.mean)))
        return "\n".join(lines)
