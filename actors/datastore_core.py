"""The datastore's state and rules without Ray: the pods and their health, versioned snapshots of
the routable ones, and the long-poll that readers follow (`DatastoreActor` adds the metrics actors).

Versions. A version increases on every change of the snapshot or of the pod set. A successful
report is a change even when the values are the same: the pod's `update_time` (its scrape time) is
newer, and readers may judge freshness by it; metrics actors report unchanged pods every
`heartbeat_s`, so a snapshot's update_times are at most about that old. The first version of an
incarnation is the wall clock in microseconds, so versions keep increasing across a restart and a
reader's `since_version` from before the restart is answered at once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from actors.options import ActorOptions
from actors.pod_state import PodRecord, PodState
from actors.scrape_report import EXTRACT_ERROR_PREFIX, ScrapeReport
from scheduler import Endpoint, Metrics, ServedModel

log = logging.getLogger("ray_epp.actors.datastore")


class DatastoreCore:
    """The pods by name, the current version, and the snapshot of the routable pods at it."""

    def __init__(self, options: ActorOptions) -> None:
        self.options = options
        self.pods: dict[str, PodRecord] = {}
        self.version = time.time_ns() // 1000
        self._changed = asyncio.Event()
        self._snapshot_version = -1
        self._snapshot: list[Endpoint] = []
        self._lists: dict[tuple[ServedModel, ...], tuple[ServedModel, ...]] = {}
        # Failed scrapes since this datastore started (llm-d's data-layer error counters), by kind:
        # the page did not come (poll) or could not be read as metrics (extract).
        self.scrape_errors = {"poll": 0, "extract": 0}

    # --- versions and snapshots ----------------------------------------------------------------

    def bump(self) -> None:
        self.version += 1
        self._changed.set()
        self._changed = asyncio.Event()

    def snapshot(self) -> tuple[int, list[Endpoint]]:
        if self._snapshot_version != self.version:
            routable = [p for p in self.pods.values() if p.state is PodState.READY and p.metrics is not None]
            if not routable:
                # Fail open on an outage of the metrics path: when no pod is ready but some are only
                # stale (their metrics actor silent: one per node, so one crash silences a node's
                # pods at once), route on their last metrics, as GIE routes on its last scrape,
                # rather than answer 503 until the actor is back. A pod whose scrapes fail is
                # unhealthy, never routable; one that is draining stays out.
                routable = [p for p in self.pods.values() if p.state is PodState.STALE and p.metrics is not None]
            self._snapshot = [
                Endpoint(
                    p.spec.name, p.spec.address, p.spec.port, dict(p.spec.labels), p.metrics, served_models=p.models
                )
                for p in routable
            ]
            self._snapshot_version = self.version
        return self.version, self._snapshot

    async def watch(self, since_version: int, timeout_s: float) -> tuple[int, list[Endpoint]]:
        if self.version <= since_version:
            event = self._changed
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, timeout_s)):
                    await event.wait()
        return self.snapshot()

    # --- health --------------------------------------------------------------------------------

    def refresh_states(self) -> bool:
        """Recompute every pod's state; bump the version when one changed."""
        now = time.monotonic()
        changed = False
        for pod in self.pods.values():
            state = pod.health(now, self.options)
            if state is not pod.state:
                log.info("pod %s: %s -> %s", pod.spec.name, pod.state, state)
                pod.state = state
                changed = True
        if changed:
            self.bump()
        return changed

    def all_reported(self) -> bool:
        """Whether every pod was reported on (scraped, or failed) at least once."""
        return all(p.reports > 0 for p in self.pods.values())

    # --- reports -------------------------------------------------------------------------------

    def report(
        self,
        name: str,
        metrics: Metrics | None,
        error: str | None,
        consecutive_failures: int | None = None,
        total_failures: int | None = None,
    ) -> bool:
        """A scrape outcome from a metrics actor; False when the pod is unknown (e.g. removed)."""
        known, changed = self._apply(name, metrics, error, consecutive_failures, total_failures)
        if changed:
            self.bump()
        return known

    def report_batch(self, reports: list[ScrapeReport]) -> int:
        """Several scrape outcomes, one version bump at most; returns how many pods were known."""
        known = 0
        changed = False
        for name, metrics, error, consecutive, total in reports:
            k, c = self._apply(name, metrics, error, consecutive, total)
            known += k
            changed = changed or c
        if changed:
            self.bump()
        return known

    def _apply(
        self,
        name: str,
        metrics: Metrics | None,
        error: str | None,
        consecutive_failures: int | None,
        total_failures: int | None,
    ) -> tuple[bool, bool]:
        """(pod known, snapshot changed)"""
        pod = self.pods.get(name)
        if pod is None:
            return False, False
        now = time.monotonic()
        pod.reports += 1
        changed = False
        if metrics is not None and error is None:
            # a success is news even when the values are the same: its update_time is newer, and
            # readers judge freshness by it (utilization-detector's 200 ms metricsStalenessThreshold)
            pod.last_seen = now
            pod.consecutive_failures = 0
            changed = True
            pod.metrics = metrics
            pod.note_drain_report(now, self.options)
        else:
            pod.consecutive_failures = (
                consecutive_failures if consecutive_failures is not None else pod.consecutive_failures + 1
            )
            pod.last_error = error or "scrape failed"
        before = pod.total_failures
        if total_failures is not None:
            pod.total_failures = total_failures
        elif metrics is None or error is not None:
            pod.total_failures += 1
        added = pod.total_failures - before
        if added < 0:  # its metrics actor started again: its count did too
            added = pod.total_failures
        if added:
            # failures the metrics actor did not report one by one count as the last one reported
            kind = "extract" if (error or pod.last_error or "").startswith(EXTRACT_ERROR_PREFIX) else "poll"
            self.scrape_errors[kind] += added
        state = pod.health(now, self.options)
        if state is not pod.state:
            unhealthy = state is PodState.UNHEALTHY
            log.info("pod %s: %s -> %s%s", name, pod.state, state, f" ({pod.last_error})" if unhealthy else "")
            pod.state = state
            return True, True
        return True, changed and state is PodState.READY

    def report_models(self, name: str, models: list[ServedModel | str | dict]) -> bool:
        """A pod's `/v1/models` list (entries, or bare ids); a changed list is a new version, since
        snapshots carry it (`Endpoint.served_models`)."""
        pod = self.pods.get(name)
        if pod is None:
            return False
        entries = (m if isinstance(m, ServedModel) else ServedModel.from_json(m) for m in models)
        listed = tuple(sorted({m.id: m for m in entries}.values(), key=lambda m: m.id))
        if listed != pod.models:
            pod.models = self._shared_list(listed)
            self.bump()
        return True

    def _shared_list(self, listed: tuple[ServedModel, ...]) -> tuple[ServedModel, ...]:
        """One object for every pod that lists the same models (most pods of a pool do), so a
        snapshot pickles each distinct list once, whatever the pod count."""
        shared = self._lists.setdefault(listed, listed)
        if len(self._lists) > 2 * len(self.pods) + 16:  # forget the lists no pod holds any more
            held = {id(p.models) for p in self.pods.values()} | {id(shared)}
            self._lists = {k: v for k, v in self._lists.items() if id(v) in held}
        return shared

    def models(self) -> list[str]:
        """Model ids served by pods that are not unhealthy or draining (base models and LoRA adapters)."""
        ids: set[str] = set()
        for pod in self.pods.values():
            if pod.state not in (PodState.UNHEALTHY, PodState.DRAINING):
                ids.update(m.id for m in pod.models or ())
        return sorted(ids)

    # --- draining (actors/pod_state.py) ----------------------------------------------------------

    def begin_drain(self, name: str) -> bool:
        """Take a pod out of the snapshot; it stays (and is scraped) until `drained` lets it go."""
        pod = self.pods.get(name)
        if pod is None or pod.draining_since is not None:
            return False
        pod.draining_since = time.monotonic()
        pod.drain_idle = False
        log.info("pod %s: %s -> draining", name, pod.state)
        pod.state = PodState.DRAINING
        self.bump()
        return True

    def end_drain(self, name: str) -> bool:
        """A draining pod that is wanted again: routable again once its reports say so."""
        pod = self.pods.get(name)
        if pod is None or pod.draining_since is None:
            return False
        pod.draining_since = None
        pod.drain_idle = False
        pod.state = pod.health(time.monotonic(), self.options)
        log.info("pod %s: drain cancelled -> %s", name, pod.state)
        self.bump()
        return True

    def drained(self) -> dict[str, str]:
        """Draining pods that may leave now, with the reason."""
        now = time.monotonic()
        return {n: why for n, p in self.pods.items() if (why := p.drained(now, self.options)) is not None}

    def status(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        return [pod.status(now) for pod in self.pods.values()]
