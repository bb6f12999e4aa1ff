"""Baseline routers for the cluster simulation.

All of them skip prefill-only pods (role label `prefill`) when any other pod exists, and break ties
with a seeded RNG, so that a stale tie does not always land on the first pod.
"""

from __future__ import annotations

import random

from ray_epp.simulator.report import RequestResult
from ray_epp.simulator.routing import PodView, SimRequest


def _candidates(pods: list[PodView]) -> list[PodView]:
    serving = [p for p in pods if p.role != "prefill"]
    return serving or pods


def _queue(p: PodView) -> int:
    m = p.metrics
    return int(m.get("waiting_queue_size", 0)) + int(m.get("running_requests_size", 0))


class RoundRobin:
    def __init__(self, seed: int = 0) -> None:
        self._i = 0

    def route(self, request: SimRequest, pods: list[PodView], now: float) -> str:
        cands = _candidates(pods)
        pod = cands[self._i % len(cands)]
        self._i += 1
        return pod.name


class RandomRouter:
    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)

    def route(self, request: SimRequest, pods: list[PodView], now: float) -> str:
        return self.rng.choice(_candidates(pods)).name


class LeastQueue:
    """The pod with the fewest waiting + running requests in its last scraped metrics."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)

    def route(self, request: SimRequest, pods: list[PodView], now: float) -> str:
        cands = _candidates(pods)
        best = min(_queue(p) for p in cands)
        return self.rng.choice([p for p in cands if _queue(p) == best]).name


class PowerOfTwo:
    """Ray Serve's default: sample two pods, send to the one with the shorter queue.

    Like Ray Serve's router, the queue is the router's own count of requests it has sent to a pod
    and not yet seen complete (exact, not scraped). `use_metrics=True` uses scraped waiting+running.
    """

    def __init__(self, seed: int = 0, use_metrics: bool = False) -> None:
        self.rng = random.Random(seed)
        self.use_metrics = use_metrics
        self.in_flight: dict[str, int] = {}

    def _len(self, p: PodView) -> int:
        return _queue(p) if self.use_metrics else self.in_flight.get(p.name, 0)

    def route(self, request: SimRequest, pods: list[PodView], now: float) -> str:
        cands = _candidates(pods)
        pair = self.rng.sample(cands, 2) if len(cands) >= 2 else cands
        a, b = self._len(pair[0]), self._len(pair[-1])
        pick = pair[0] if a < b else pair[-1] if b < a else self.rng.choice(pair)
        self.in_flight[pick.name] = self.in_flight.get(pick.name, 0) + 1
        return pick.name

    def on_complete(self, request: SimRequest, pod: str | None, result: RequestResult) -> None:
        if pod is not None and self.in_flight.get(pod, 0) > 0:
            self.in_flight[pod] -= 1


BASELINES = {"round-robin": RoundRobin, "random": RandomRouter, "least-queue": LeastQueue, "power-of-two": PowerOfTwo}
