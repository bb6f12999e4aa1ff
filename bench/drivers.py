"""Drivers run one workload through one policy and return per-request outcomes and figures.

`ClusterSimDriver` runs the policy as a router of the discrete-event cluster simulation. An
end-to-end driver (requests over HTTP through a real gateway or peer router to simulated pods)
implements the same `Driver` protocol: start the system under test for `policy`, send each
SimRequest's body at its `arrival_time`, and turn the responses into `Outcome`s (TTFT from the
first streamed token, `usage.prompt_tokens_details.cached_tokens`, a 429 as a shed)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from bench.metrics import ERROR, SHED, Outcome, dist_ms, summarize
from bench.policies import make_policy
from ray_epp.simulator import HOLD, PodConfig, PodView, RequestResult, SimRequest, run_cluster_sim
from ray_epp.simulator.report import DROPPED, OK, REJECTED


@dataclass(slots=True)
class RunResult:
    outcomes: list[Outcome]
    metrics: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)


class Driver(Protocol):
    name: str

    def run(self, policy: str, pods: list[PodConfig], workload: list[SimRequest], seed: int) -> RunResult: ...


class TimedRouter:
    """Wraps a router to time each decision (wall clock): the policy's overhead per request.

    A router that holds requests (flow control answers HOLD and hands them back from `poll`)
    decides in `poll`: a held request's decision time is its `route` call (the enqueue) plus its
    share of the `poll` call that released it, so `route_s` has one entry per decided request."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.route_s: list[float] = []
        self._held: dict[str, float] = {}  # request id -> its route (enqueue) time
        self._on_complete = getattr(inner, "on_complete", None)
        if callable(getattr(inner, "on_first_token", None)):
            self.on_first_token = inner.on_first_token
        if callable(getattr(inner, "on_kv_events", None)):  # the simulation publishes only to a listener
            self.on_kv_events = inner.on_kv_events
        if callable(getattr(inner, "poll", None)):
            self._poll = inner.poll
            self.poll = self._timed_poll
            self.next_poll = inner.next_poll

    def route(self, request: SimRequest, pods: list[PodView], now: float) -> Any:
        t = time.perf_counter()
        decision = self.inner.route(request, pods, now)
        elapsed = time.perf_counter() - t
        if decision is HOLD:
            self._held[request.request_id] = elapsed
        else:
            self.route_s.append(elapsed)
        return decision

    def _timed_poll(self, pods: list[PodView], now: float) -> list[tuple[SimRequest, Any]]:
        t = time.perf_counter()
        released = self._poll(pods, now)
        if released:
            share = (time.perf_counter() - t) / len(released)
            self.route_s.extend(self._held.pop(r.request_id, 0.0) + share for r, _ in released)
        return released

    def on_complete(self, request: SimRequest, pod: str | None, result: RequestResult) -> None:
        if self._on_complete is not None:
            self._on_complete(request, pod, result)


class ClusterSimDriver:
    name = "cluster-sim"

    def __init__(self, scrape_interval: float = 0.05) -> None:
        self.scrape_interval = scrape_interval

    def run(self, policy: str, pods: list[PodConfig], workload: list[SimRequest], seed: int) -> RunResult:
        router = TimedRouter(make_policy(policy, seed))
        try:
            report = run_cluster_sim(pods, workload, router, scrape_interval=self.scrape_interval, seed=seed)
        finally:
            close = getattr(router.inner, "close", None)
            if callable(close):
                close()
        shed: set[str] = getattr(router.inner, "shed", set())
        by_id = {r.request_id: r for r in workload}
        outcomes = [outcome(r, by_id[r.request_id], shed) for r in report.results]
        metrics = summarize(outcomes, report.duration)
        metrics["lora_loads"] = report.lora_loads
        metrics["preemptions"] = report.preemptions
        route_us = dist_ms(router.route_s)
        metrics["route_us"] = {k: v * 1000 for k, v in route_us.items()}
        metrics["wall_s"] = report.wall_time_s
        errors = getattr(router.inner, "errors", {})
        extra = {"errors": dict(list(errors.items())[:5])} if errors else {}
        rejected = [r.error for r in report.results if r.status == REJECTED][:5]
        if rejected:
            extra["rejected"] = rejected
        return RunResult(outcomes, metrics, extra)


def outcome(r: RequestResult, req: SimRequest, shed: set[str]) -> Outcome:
    status = OK if r.status == OK else SHED if r.status == DROPPED and r.request_id in shed else ERROR
    return Outcome(
        request_id=r.request_id,
        status=status,
        arrival=r.arrival,
        priority=req.priority,
        model=r.model,
        ttft=r.ttft,
        itl=r.itl,
        e2e=r.e2e,
        prompt_tokens=r.prompt_tokens,
        cached_tokens=r.cached_tokens,
        output_tokens=r.output_tokens,
    )
