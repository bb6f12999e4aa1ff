"""A pod as the datastore knows it: its spec, the metrics actor that scrapes it, its latest metrics
and its health.

Health. A pod is `starting` until its first report, `ready` while its last successful report is
younger than `staleness_threshold_s` (metrics actors report at least every `heartbeat_s`),
`stale` after that, and `unhealthy` after `unhealthy_after_failures` consecutive failed scrapes.
Only `ready` pods are routable; a pod that recovers is re-admitted by its next report."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from actors.options import ActorOptions, PodSpec
from scheduler import Metrics


class PodState(StrEnum):
    STARTING = "starting"
    READY = "ready"
    STALE = "stale"
    UNHEALTHY = "unhealthy"


@dataclass(slots=True)
class PodRecord:
    spec: PodSpec
    actor: Any = None  # the metrics actor that scrapes it
    group: str = ""  # that actor's group
    metrics: Metrics | None = None
    last_seen: float | None = None  # monotonic time of the last successful report
    consecutive_failures: int = 0
    total_failures: int = 0
    reports: int = 0
    last_error: str | None = None
    models: list[str] = field(default_factory=list)
    added: float = field(default_factory=time.monotonic)
    state: PodState = PodState.STARTING

    def health(self, now: float, options: ActorOptions) -> PodState:
        """The state the rules above give at monotonic time `now` (`state` is the last one seen)."""
        if self.consecutive_failures >= options.unhealthy_after_failures:
            return PodState.UNHEALTHY
        if self.last_seen is None:
            return PodState.STARTING if now - self.added <= options.staleness_threshold_s else PodState.STALE
        if now - self.last_seen > options.staleness_threshold_s:
            return PodState.STALE
        return PodState.READY

    def status(self, now: float) -> dict[str, Any]:
        """The row of `DatastoreActor.status()`."""
        spec = self.spec
        return {
            "name": spec.name,
            "address": spec.address,
            "port": spec.port,
            "labels": dict(spec.labels),
            "state": self.state.value,
            "routable": self.state is PodState.READY,
            "consecutive_failures": self.consecutive_failures,
            "total_failures": self.total_failures,
            "reports": self.reports,
            "last_error": self.last_error,
            "last_update_age_s": None if self.last_seen is None else round(now - self.last_seen, 3),
            "served_models": list(self.models),
            "metrics": None if self.metrics is None else self.metrics.to_json(),
        }
