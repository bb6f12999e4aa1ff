"""A pod as the datastore knows it: its spec, the metrics actor that scrapes it, its latest metrics
and its health.

Health. A pod is `starting` until its first report, `ready` while its last successful report is
younger than `staleness_threshold_s` (metrics actors report at least every `heartbeat_s`),
`stale` after that, and `unhealthy` after `unhealthy_after_failures` consecutive failed scrapes.
Only `ready` pods are routable (when none is, the `stale` ones are: datastore_core.py); a pod that
recovers is re-admitted by its next report.

Draining. A removed pod is `draining` first (when the removal asks for it): no new requests go to
it, its metrics actor keeps scraping it, and it leaves the pod set once it reports no running and no
waiting requests at least `drain_settle_s` after the drain began (requests scheduled on a snapshot
from before the drain have reached it by then), once it is unhealthy or stale (nothing in it can
finish), or at `drain_timeout_s`. The EPP never cuts a request: draining only decides when the pod
leaves the pool, so an operator knows when it is safe to stop the server."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from actors.options import ActorOptions, PodSpec
from scheduler import Metrics, ServedModel


class PodState(StrEnum):
    STARTING = "starting"
    READY = "ready"
    STALE = "stale"
    UNHEALTHY = "unhealthy"
    DRAINING = "draining"


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
    models: tuple[ServedModel, ...] | None = None  # its /v1/models list; None until first collected
    added: float = field(default_factory=time.monotonic)
    state: PodState = PodState.STARTING
    source: str = ""  # which pod source owns it ("" when unknown: rebuilt after a datastore restart)
    draining_since: float | None = None  # monotonic time the drain began
    drain_idle: bool = False  # a report since drain_settle_s showed no running or waiting request

    def health(self, now: float, options: ActorOptions) -> PodState:
        """The state the rules above give at monotonic time `now` (`state` is the last one seen)."""
        if self.draining_since is not None:
            return PodState.DRAINING
        return self.liveness(now, options)

    def liveness(self, now: float, options: ActorOptions) -> PodState:
        """The state from reports alone, draining or not."""
        if self.consecutive_failures >= options.unhealthy_after_failures:
            return PodState.UNHEALTHY
        if self.last_seen is None:
            return PodState.STARTING if now - self.added <= options.staleness_threshold_s else PodState.STALE
        if now - self.last_seen > options.staleness_threshold_s:
            return PodState.STALE
        return PodState.READY

    def drained(self, now: float, options: ActorOptions) -> str | None:
        """Why a draining pod may leave now ("idle", "unhealthy", "stale", "timeout"), or None."""
        if self.draining_since is None:
            return None
        if self.drain_idle:
            return "idle"
        live = self.liveness(now, options)
        if live in (PodState.UNHEALTHY, PodState.STALE):
            return live.value
        if now - self.draining_since >= options.drain_timeout_s:
            return "timeout"
        return None

    def note_drain_report(self, now: float, options: ActorOptions) -> None:
        """A successful report of a draining pod: idle once it shows nothing running or waiting
        after the settle time."""
        if self.draining_since is None or self.metrics is None or now - self.draining_since < options.drain_settle_s:
            return
        m = self.metrics
        self.drain_idle = m.running_requests_size == 0 and m.waiting_queue_size == 0

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
            "source": self.source or "unknown",
            "draining_s": None if self.draining_since is None else round(now - self.draining_since, 3),
            "consecutive_failures": self.consecutive_failures,
            "total_failures": self.total_failures,
            "reports": self.reports,
            "last_error": self.last_error,
            "last_update_age_s": None if self.last_seen is None else round(now - self.last_seen, 3),
            "served_models": [m.id for m in self.models or ()],
            "metrics": None if self.metrics is None else self.metrics.to_json(),
        }
