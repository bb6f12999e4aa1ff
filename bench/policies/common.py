"""Helpers the peer policies share: candidate pods, request text, a router's own in-flight counts."""

from __future__ import annotations

import random

from ray_epp.simulator import PodView, RequestResult, SimRequest


def serving(pods: list[PodView]) -> list[PodView]:
    """Pods that can serve a whole request (not prefill-only); all of them if none can."""
    out = [p for p in pods if p.role != "prefill"]
    return out or pods


def request_text(request: SimRequest) -> str:
    """What a text-based router keys on: the prompt, or for chat the flattened conversation (its
    earlier turns are a prefix of the next turn's text, as in the peers' own text extraction)."""
    prompt = request.prompt
    return prompt if isinstance(prompt, str) else ",".join(map(str, prompt))


class InFlight:
    """A router's count of requests it sent to each pod and has not yet seen complete: the load
    figure SGLang's router and Ray Serve's routers balance on (not scraped metrics)."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self.in_flight: dict[str, int] = {}

    def load(self, pod: str) -> int:
        return self.in_flight.get(pod, 0)

    def least_loaded(self, names: list[str]) -> str:
        """The name with the fewest requests in flight, ties broken at random (seeded)."""
        least = min(map(self.load, names))
        return self.rng.choice([n for n in names if self.load(n) == least])

    def sent(self, pod: str) -> None:
        self.in_flight[pod] = self.in_flight.get(pod, 0) + 1

    def on_complete(self, request: SimRequest, pod: str | None, result: RequestResult) -> None:
        if pod is not None and self.in_flight.get(pod, 0) > 0:
            self.in_flight[pod] -= 1
