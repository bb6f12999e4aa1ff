"""What bench/serve_llm_routing.py measures of one run beside latency: where a request's TTFT went
(phases), why engine TTFTs are what they are (diagnose), how late the event loops woke and the
garbage collector's pauses (LoopWatch), and the routers' own counters in this process."""

from __future__ import annotations

import asyncio
import gc
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from bench.serve_llm_timed_routers import choose_samples

# --- one run ---------------------------------------------------------------------------------------


@dataclass(slots=True)
class RunResult:
    workload: str
    router: str
    replicas: int
    requests: int
    failed: int
    ttft_p50_ms: float
    ttft_p90_ms: float
    engine_ttft_p90_ms: float  # inside the replica: the engine's queue and prefill only
    e2e_p90_ms: float
    hit_rate: float
    spread: dict[str, int]
    choose_p50_ms: float | None
    choose_p90_ms: float | None
    routed_by: str  # the router class that timed this run's choices (Serve caches routers by deployment)
    wall_s: float
    errors: list[str] = field(default_factory=list)
    diagnosis: dict[str, Any] = field(default_factory=dict)  # see `diagnose`
    router_debug: dict[str, Any] = field(default_factory=dict)  # EPP only: see `epp_debug`


def diagnose(answers: list[dict[str, Any]]) -> dict[str, Any]:
    """Why engine TTFTs are what they are: misses (less than half the prompt cached) and the
    requests that reached their replica while a miss there was still waiting for its first token
    (queued behind its prefill), the routing delay (caller's TTFT minus the engine's), and how many
    replicas each shared-prefix group was spread over."""
    misses = [a for a in answers if a["cached_tokens"] < a["prompt_tokens"] / 2]
    behind = [
        a for a in answers
        if any(m is not a and m["replica"] == a["replica"] and m["engine_start"] <= a["engine_start"]
               < m["engine_start"] + m["ttft_s"] for m in misses)
    ]  # fmt: skip
    hits = [a for a in answers if a not in misses]
    groups: dict[str, set[str]] = {}
    for a in answers:
        groups.setdefault(a["group"], set()).add(a["replica"])
    return {
        "misses": len(misses),
        "behind_a_miss": len(behind),
        "hit_engine_ttft_p50_ms": 1e3 * quantile([a["ttft_s"] for a in hits], 0.5),
        "hit_engine_ttft_p90_ms": 1e3 * quantile([a["ttft_s"] for a in hits], 0.9),
        "miss_engine_ttft_p90_ms": 1e3 * quantile([a["ttft_s"] for a in misses], 0.9),
        "routing_delay_p50_ms": 1e3 * quantile([a["ttft_client_s"] - a["ttft_s"] for a in answers], 0.5),
        "routing_delay_p90_ms": 1e3 * quantile([a["ttft_client_s"] - a["ttft_s"] for a in answers], 0.9),
        "routing_delay_max_ms": 1e3 * max((a["ttft_client_s"] - a["ttft_s"] for a in answers), default=0.0),
        "groups": len(groups),
        "replicas_per_group": dict(sorted(Counter(len(r) for r in groups.values()).items())),
    }


PHASES = ("to_router", "router_queue", "choose", "dispatch", "replica_prep", "engine", "back")


def phases(answer: dict[str, Any], line: dict[str, float] | None) -> dict[str, float] | None:
    """Where one request's caller TTFT went, in seconds (they sum to it): the handle's hop to the
    router (`to_router`: call to Serve's pending request), the wait for a routing task
    (`router_queue`), `choose` (first choose_replicas start to last end: several on back-off),
    `dispatch` (the choice to the replica's method starting: Serve's rejection round trip and the
    actor call), `replica_prep` (the method before the engine call), `engine` (the engine's queue
    and prefill) and `back` (the answer's way back to the caller)."""
    if line is None or "choose_end" not in line:
        return None
    out = {
        "to_router": line["created"] - answer["sent_wall"],
        "router_queue": line["choose_start"] - line["created"],
        "choose": line["choose_end"] - line["choose_start"],
        "dispatch": answer["received_wall"] - line["choose_end"],
        "replica_prep": answer["prep_s"],
        "engine": answer["ttft_s"],
    }
    out["back"] = answer["ttft_client_s"] - sum(out.values())
    return out


def breakdown(answers: list[dict[str, Any]]) -> dict[str, Any]:
    """The phases' p50 / p90 over all requests, and their mean over the slowest tenth (TTFT at or
    above its p90): what the tail is made of."""
    split = [(a["ttft_client_s"], p) for a in answers if (p := a.get("phases"))]
    if not split:
        return {}
    cut = quantile([t for t, _ in split], 0.9)
    tail = [p for t, p in split if t >= cut]
    out: dict[str, Any] = {"timed": len(split)}
    for name in PHASES:
        values = [p[name] for _, p in split]
        out[name] = {"p50_ms": 1e3 * quantile(values, 0.5), "p90_ms": 1e3 * quantile(values, 0.9),
                     "tail_mean_ms": 1e3 * sum(p[name] for p in tail) / len(tail)}  # fmt: skip
    return out


class LoopWatch:
    """While a run is sent: how late this process's event loop wakes (the routers, the handle and
    the sender share it, so a stall delays every request routed in it) and the garbage
    collector's pauses here."""

    TICK_S = 0.002

    def __init__(self, router_loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.late_s: list[float] = []
        self.router_late_s: list[float] = []  # the same on the router's own loop
        self.gc_s: list[float] = []
        self._gc_started = 0.0
        self._task: asyncio.Task | None = None
        self._router_loop = router_loop
        self._router_task: Any = None

    async def _tick(self, into: list[float]) -> None:
        while True:
            before = time.perf_counter()
            await asyncio.sleep(self.TICK_S)
            into.append(time.perf_counter() - before - self.TICK_S)

    def _gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        elif info.get("generation", 0) >= 1:
            self.gc_s.append(time.perf_counter() - self._gc_started)

    def __enter__(self) -> LoopWatch:
        gc.callbacks.append(self._gc)
        self._task = asyncio.get_running_loop().create_task(self._tick(self.late_s))
        if self._router_loop is not None and self._router_loop is not asyncio.get_running_loop():
            self._router_task = asyncio.run_coroutine_threadsafe(self._tick(self.router_late_s), self._router_loop)
        return self

    def __exit__(self, *_: Any) -> None:
        gc.callbacks.remove(self._gc)
        if self._task is not None:
            self._task.cancel()
        if self._router_task is not None:
            self._router_task.cancel()

    def summary(self) -> dict[str, Any]:
        late = sorted(self.late_s)
        return {
            "loop_late_p50_ms": 1e3 * quantile(late, 0.5),
            "loop_late_p99_ms": 1e3 * quantile(late, 0.99),
            "loop_late_max_ms": 1e3 * max(late, default=0.0),
            "loop_late_over_50ms": sum(1 for x in late if x > 0.05),
            "router_loop_late_p50_ms": 1e3 * quantile(self.router_late_s, 0.5),
            "router_loop_late_p90_ms": 1e3 * quantile(self.router_late_s, 0.9),
            "router_loop_late_p99_ms": 1e3 * quantile(self.router_late_s, 0.99),
            "router_loop_late_max_ms": 1e3 * max(self.router_late_s, default=0.0),
            "gc_gen12_pauses": len(self.gc_s),
            "gc_max_ms": 1e3 * max(self.gc_s, default=0.0),
        }


def epp_routers(deployment: str) -> list[Any]:
    from serve_app.llm_router.router_stats import routers

    return [r for r in routers() if r._deployment_id.name == deployment]


def process_state() -> dict[str, Any]:
    """What this process holds after a run: EPP routers alive (of this and earlier runs) and the
    objects the garbage collector tracks (what a full collection walks)."""
    from serve_app.llm_router.router_stats import routers

    gc.collect()  # after the run: count what is alive, not garbage not yet collected
    return {"epp_routers_alive": len(routers()), "gc_tracked_objects": len(gc.get_objects())}


def epp_debug(deployment: str, reset: bool = False) -> dict[str, Any]:
    """The EPP routers of `deployment` in this process: decisions taken before an earlier one was
    routed, and the decision-to-routed delay (then cleared with `reset`)."""
    from serve_app.llm_router.router_stats import percentiles_ms, routers

    epp = [r for r in routers() if r._deployment_id.name == deployment]
    out = {
        "decided_unseen": sum(r.counters.decided_unseen for r in epp),
        "scheduled": sum(r.counters.scheduled for r in epp),
        "routed_not_first": sum(r.counters.routed_not_first for r in epp),
        "first_tokens_inferred": sum(r.counters.first_tokens_inferred for r in epp),
        "routed_after_ms": percentiles_ms([s for r in epp for s in r.counters.routed_after_s]),
        "mirror_lag_ms": percentiles_ms([s for r in epp for s in r.mirror.counters.lag_s]),
    }
    if reset:
        for r in epp:
            r.counters.decided_unseen = r.counters.scheduled = r.counters.routed_not_first = 0
            r.counters.first_tokens_inferred = 0
            r.counters.routed_after_s.clear()
    return out


def quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def choose_times(deployment: str) -> tuple[str, list[float]]:
    """The class of the router that chose for `deployment` in this process and its choose_replicas
    samples, then cleared ("none" when no timed router chose)."""
    from serve_app.llm_router import router as llm_router

    epp = [r for r in llm_router._routers() if r._deployment_id.name == deployment]
    if epp and any(r.counters.choose_s for r in epp):
        samples = [s for r in epp for s in r.counters.choose_s]
        for r in epp:
            r.counters.choose_s.clear()
        return type(epp[0]).__name__, samples
    cls, samples = choose_samples().get(deployment, ("none", []))
    out = list(samples)
    samples.clear()
    return cls, out
