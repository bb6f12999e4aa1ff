"""A pool shared by the gateway and clients that call the pods' Kubernetes Service directly.

`ServiceBypass(router)` is what the cluster simulation routes with when part of a workload does
not go through the gateway (`bench.workloads.shared_pool`): a direct request goes to a pod drawn
uniformly at random (kube-proxy's choice per connection) and the router under test never hears of
it — no route, no first token, no completion. Everything the router would see in reality still
reaches it: its own requests' callbacks, the pods' scraped metrics (which carry the direct traffic's
load) and, when it listens, every pod's KV events (which carry every block, whoever sent it)."""

from __future__ import annotations

import random
from typing import Any

from bench.workloads.shared_pool import is_direct
from ray_epp.simulator import PodView, RequestResult, RouteDecision, SimRequest


class ServiceBypass:
    def __init__(self, router: Any, seed: int = 0, pod: str | None = None) -> None:
        self.router = router
        self.service = random.Random(f"service:{seed}")
        self.pod = pod  # every direct request to this pod (a client wired to one pod), else at random
        self.direct: set[str] = set()  # ids of the requests that bypassed the router
        # Only what the inner router has: ClusterSim turns pod events on when `on_kv_events` exists.
        for hook in ("on_kv_events", "poll", "next_poll"):
            if hasattr(router, hook):
                setattr(self, hook, getattr(router, hook))

    def route(self, request: SimRequest, pods: list[PodView], now: float) -> RouteDecision:
        if is_direct(request):
            self.direct.add(request.request_id)
            return self.pod if self.pod is not None else self.service.choice(pods).name
        return self.router.route(request, pods, now)

    def on_first_token(self, request: SimRequest, pod: str, now: float) -> None:
        hook = getattr(self.router, "on_first_token", None)
        if hook is not None and request.request_id not in self.direct:
            hook(request, pod, now)

    def on_complete(self, request: SimRequest, pod: str | None, result: RequestResult) -> None:
        hook = getattr(self.router, "on_complete", None)
        if hook is not None and request.request_id not in self.direct:
            hook(request, pod, result)
