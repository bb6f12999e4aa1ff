"""The registry of model servers and their latest metrics: one named async actor.

Readers never poll it per request: `watch(since_version, timeout_s)` returns as soon as the routable
snapshot changed (or at the timeout), so profile actors and gateway replicas keep a local copy.
Pod health and versions: `actors/pod_state.py`, `actors/datastore_core.py`; changes to the pod set
and its metrics actors: `actors/pod_set_reconciler.py`. A periodic check notices staleness without
waiting for a report.

Metrics actors. One `NodeMetricsActor` scrapes the pods of one Ray node (`actors/metrics_groups.py`
says which). It sends one `report_batch` per scrape round with what changed, and the datastore
bumps the version once per batch. (DESIGN.md's first design had one actor per pod; a Ray call and
an actor process each cost enough CPU that on a small machine that competed with the model
servers: bench/metrics_path_cpu.py.)

Restart. The datastore is created with max_restarts=-1. Its metrics actors are detached and named
after it (`actors/metrics_fleet.py`), so they outlive it; a restarted datastore (Ray re-runs the
constructor) rebuilds its pod list from the metrics actors it finds by name (each says which pods it
scrapes), ignoring the constructor's list (which may be out of date after add/remove), and asks each
to re-send its state at once (a metrics actor also gives up a report call in flight to the dead
incarnation). Until every pod has been reported on again (the next scrape, tens of ms), or
`staleness_threshold_s` at most, readers (`snapshot`, `watch`, `models`) wait: they keep the
snapshot they hold instead of adopting the rebuilt one, which would show a ready pool empty. Lost
in a restart: the metrics until then, the version sequence (a new, larger one starts), and how long
each pod has been known. A first start (not a restart) kills leftover metrics actors of the same
datastore name and starts from the constructor's list. A restarted metrics actor asks the datastore
for its current pod list (`pods_of_metrics_actor`).

Pod sources (`actors/pod_source.py`). Each pod has an owner: the constructor's list and `set_pods`
(`static`), `add_pod` / `remove_pod` (`runtime`), or a managed source the datastore runs itself
(a watched pods file, `sources=`), which re-runs after a restart and adopts the rebuilt pods it
lists. Removing a pod can drain it (`actors/pod_state.py`): out of the snapshot at once, gone from
the pod set when its requests are done; sources always drain. Lost in a restart besides the above:
which pods were draining (a source's next set drains them again; a pod drained by `remove_pod`
comes back and must be removed again) and the owner of rebuilt pods that no source claims (they
count as run-time pods)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from typing import Any

import ray

from actors.datastore_core import DatastoreCore
from actors.metrics_fleet import MetricsFleet, kill
from actors.metrics_groups import by_name
from actors.options import ActorOptions, PodSpec, as_options, as_pod
from actors.pod_set_reconciler import PodSetReconciler
from actors.pod_source import RUNTIME, STATIC, PodSource
from actors.pod_source_specs import build_pod_source
from actors.pod_state import PodRecord, PodState
from actors.response_pins import ResponsePins
from actors.scrape_report import ScrapeReport
from actors.snapshot_delta import DeltaLog
from actors.snapshot_relay import start_relay
from scheduler import Endpoint, Metrics

log = logging.getLogger("ray_epp.actors.datastore")


@ray.remote
class DatastoreActor:
    """The named datastore actor (default name "epp-datastore"); see the module doc."""

    def __init__(
        self,
        pods: list[dict[str, Any] | PodSpec] | None = None,
        options: dict[str, Any] | ActorOptions | None = None,
        name: str | None = None,
        namespace: str | None = None,
        sources: list[dict[str, Any]] | None = None,
    ) -> None:
        self._options = as_options(options)
        self._name = name or self._options.datastore_name
        self._namespace = namespace or ray.get_runtime_context().namespace
        self._core = DatastoreCore(self._options)
        self._deltas = DeltaLog(self._core.version)  # readers from an earlier incarnation get the full pool
        self._fleet = MetricsFleet(self._name, self._namespace, self._options)
        self._initial = [as_pod(p) for p in pods or []]
        self._restarted = ray.get_runtime_context().was_current_actor_reconstructed
        self._bootstrapped = asyncio.Event()
        self._bootstrap_error: str | None = None
        self._published = asyncio.Event()  # readers may see snapshots (see "Restart" above)
        self._held_s: float | None = None  # how long a restart held the readers
        self._lock = asyncio.Lock()
        self._relays: dict[str, Any] = {}  # node id -> its snapshot relay (actors/snapshot_relay.py)
        self._pins = ResponsePins()  # the Responses API's stored responses: which pod holds each
        self._sources: dict[str, PodSource] = {}
        for source in map(build_pod_source, sources or []):
            self._sources[source.id] = source
        self._pod_set = PodSetReconciler(self._core, self._fleet, self._sources, self._options)
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._bootstrap()), loop.create_task(self._check_loop())]

    # --- start-up and rebuild ------------------------------------------------------------------

    async def _bootstrap(self) -> None:
        try:
            async with self._lock:
                found = await self._fleet.find()
                alive = [(group, handle, specs) for group, handle, specs in found if specs is not None]
                if self._restarted and alive:
                    log.warning("datastore %s restarted: rebuilding from %d metrics actors", self._name, len(alive))
                    for group, handle, specs in alive:
                        self._fleet.handles[group] = handle
                        for spec in specs:
                            if spec.name not in self._core.pods:
                                self._core.pods[spec.name] = PodRecord(spec, handle, group)
                        with contextlib.suppress(Exception):
                            handle.resync.remote()
                    self._core.bump()
                else:
                    for _, handle, _ in found:  # leftovers of an earlier datastore of this name
                        kill(handle)
                    await self._pod_set.set_unmanaged(self._initial, STATIC, drain=False)
            await self._start_sources()
        except Exception as err:
            self._bootstrap_error = f"{type(err).__name__}: {err}"
            log.exception("datastore %s failed to start: %s", self._name, err)
        finally:
            self._bootstrapped.set()
        if self._restarted and self._bootstrap_error is None:
            await self._hold_until_reported()
        self._published.set()

    async def _hold_until_reported(self) -> None:
        """A rebuilt datastore knows its pods but none of their metrics: published now, its first
        snapshot would be an empty pool while every pod is up. Readers wait until every pod was
        reported on again (the metrics actors were asked to resync: the next scrape), or at most
        staleness_threshold_s, after which an unreported pod is stale anyway."""
        limit = self._options.staleness_threshold_s
        started = time.monotonic()
        if not await self._until_reported(limit):
            silent = sorted(n for n, p in self._core.pods.items() if p.reports == 0)
            log.warning("datastore %s: no report from %s %.1fs after the restart", self._name, silent, limit)
        self._held_s = time.monotonic() - started

    async def _until_reported(self, timeout_s: float) -> bool:
        """Wait until every pod was reported on once (scraped, or failed), or timeout_s."""
        deadline = time.monotonic() + timeout_s
        while not self._core.all_reported():
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.01)
        return True

    async def _ready(self) -> None:
        if not self._bootstrapped.is_set():
            await self._bootstrapped.wait()

    async def _readable(self) -> None:
        """For readers of the pool: after start-up, and after a restart's hold."""
        if not self._published.is_set():
            await self._published.wait()

    async def _check_loop(self) -> None:
        while True:
            await asyncio.sleep(self._options.check_interval_s)
            try:
                self._core.refresh_states()
                if self._core.drained():
                    async with self._lock:
                        await self._pod_set.finish_drains()
            except Exception as err:  # keep checking
                log.exception("state check failed: %s", err)

    async def _start_sources(self) -> None:
        """Run every managed source; wait (10 s at most) for each one's first load, so the first
        snapshot already has the pods."""
        loop = asyncio.get_running_loop()
        for source in self._sources.values():
            self._tasks.append(loop.create_task(self._run_source(source)))
        firsts = [s.first_attempt.wait() for s in self._sources.values() if hasattr(s, "first_attempt")]
        if firsts:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*firsts), 10.0)

    async def _run_source(self, source: PodSource) -> None:
        async def publish(specs: list[PodSpec]) -> dict[str, list[str]]:
            names = set(by_name(specs))
            async with self._lock:
                gone = [n for n, p in self._core.pods.items() if p.source == source.id and n not in names]
                return await self._pod_set.reconcile(specs, source=source.id, remove=gone, drain=True)

        try:
            await source.run(publish)
        except asyncio.CancelledError:
            raise
        except Exception as err:
            log.exception("pod source %s stopped: %s", source.id, err)

    # --- the API -------------------------------------------------------------------------------

    async def ping(self) -> int:
        """The current version once the datastore has started (raises if start-up failed)."""
        await self._ready()
        if self._bootstrap_error is not None:
            raise RuntimeError(f"datastore {self._name} failed to start: {self._bootstrap_error}")
        return self._core.version

    async def snapshot(self) -> tuple[int, list[Endpoint]]:
        """(version, routable endpoints): healthy pods with fresh metrics."""
        await self._readable()
        return self._core.snapshot()

    async def watch(self, since_version: int, timeout_s: float) -> tuple[int, list[Endpoint]]:
        """Like snapshot(), but waits until the version is newer than `since_version` (or timeout_s)."""
        await self._readable()
        return await self._core.watch(since_version, timeout_s)

    async def watch_delta(self, since_version: int, timeout_s: float) -> bytes:
        """Like watch(), but answers a pickled `SnapshotDelta` from `since_version`: only what
        changed, pickled once for every reader at that version (actors/snapshot_delta.py)."""
        await self._readable()
        version, endpoints = await self._core.watch(since_version, timeout_s)
        return self._deltas.packed(since_version, version, endpoints)

    async def relay_for(self, node_id: str) -> Any | None:
        """The snapshot relay of a Ray node, started on the first ask and again once it died; None
        when relays are off (`snapshot_relays`). Readers on that node follow it instead of this
        actor (actors/snapshot_relay.py, actors/pool_feed.py)."""
        if not self._options.snapshot_relays:
            return None
        me = ray.get_runtime_context().current_actor
        args = (self._relays.get(node_id), me, self._name, self._namespace, node_id, self._options.watch_timeout_s)
        # Kept here: Ray ends an actor, named or not, once its creator holds no handle to it.
        self._relays[node_id] = relay = await asyncio.to_thread(start_relay, *args)
        return relay

    async def status(self) -> list[dict[str, Any]]:
        """Every pod: state (ready / stale / unhealthy / starting), failures, age of its last report,
        served models, metrics."""
        await self._ready()
        return self._core.status()

    async def observability(self) -> dict[str, Any]:
        """What /metrics shows of the datastore: per pod its state and the age of its last
        successful report (None before the first), and the failed scrapes counted since it started."""
        await self._ready()
        now = time.monotonic()
        pods = [
            (p.spec.name, p.state.value, None if p.last_seen is None else now - p.last_seen)
            for p in self._core.pods.values()
        ]
        return {"pods": pods, "scrape_errors": dict(self._core.scrape_errors)}

    async def models(self) -> list[str]:
        await self._readable()
        return self._core.models()

    async def version(self) -> int:
        return self._core.version

    async def pods(self) -> list[dict[str, Any]]:
        await self._ready()
        return [p.spec.model_dump() for p in self._core.pods.values()]

    async def report(
        self,
        name: str,
        metrics: Metrics | None,
        error: str | None,
        consecutive_failures: int | None = None,
        total_failures: int | None = None,
    ) -> bool:
        """From a metrics actor: a successful scrape (metrics, None) or a failure (None, error).
        The optional counts are the metrics actor's own (it throttles failure reports)."""
        await self._ready()
        return self._core.report(name, metrics, error, consecutive_failures, total_failures)

    async def report_batch(self, reports: list[ScrapeReport]) -> int:
        """From a metrics actor: a `ScrapeReport` per pod it has something to say about; one
        version bump at most. Returns how many pods are known."""
        await self._ready()
        return self._core.report_batch(reports)

    async def pods_of_metrics_actor(self, group: str) -> list[dict[str, Any]] | None:
        """What the metrics actor of `group` should scrape (it asks after a restart); None when the
        group is retired."""
        await self._ready()
        if group not in self._fleet.handles:
            return None
        return [p.spec.model_dump() for p in self._core.pods.values() if p.group == group]

    async def report_models(self, name: str, models: list) -> bool:
        await self._ready()
        return self._core.report_models(name, models)

    async def add_pod(self, spec: dict[str, Any] | PodSpec) -> dict[str, list[str]]:
        """Add a pod (or replace one of the same name whose address, port or labels changed; a
        draining one is wanted again). PodConflict when a managed source owns that name."""
        await self._ready()
        async with self._lock:
            return await self._pod_set.reconcile([as_pod(spec)], source=RUNTIME, remove=[], drain=False)

    async def remove_pod(self, name: str, drain: bool = False) -> bool:
        """Remove a pod at once, or (`drain`) take it out of the snapshot and remove it when its
        requests are done. False when there is no such pod; PodConflict when a managed source
        owns it."""
        await self._ready()
        async with self._lock:
            if name not in self._core.pods:
                return False
            self._pod_set.check_owner([name], RUNTIME)
            await self._pod_set.reconcile([], source=RUNTIME, remove=[name], drain=drain)
            return True

    async def set_pods(self, specs: list[dict[str, Any] | PodSpec], drain: bool = False) -> dict[str, list[str]]:
        """Make the pods no managed source owns exactly `specs` (the whole pod set when there is no
        managed source): start, replace and retire metrics actors; removed pods drain with `drain`."""
        await self._ready()
        async with self._lock:
            return await self._pod_set.set_unmanaged([as_pod(s) for s in specs], STATIC, drain)

    async def sources(self) -> list[dict[str, Any]]:
        """Every managed pod source's status (a watched file: pods, last load, the error that keeps
        its last good set)."""
        await self._ready()
        return [s.status() for s in self._sources.values()]

    async def draining(self) -> list[str]:
        await self._ready()
        return sorted(n for n, p in self._core.pods.items() if p.state is PodState.DRAINING)

    async def wait_settled(self, timeout_s: float) -> int:
        """Wait until every pod was reported on once (scraped, or failed), or timeout_s; returns the
        version then. (Not "until none is `starting`": a pod whose metrics actor is slow to start
        goes from starting to stale without a report.)"""
        await self._ready()
        await self._until_reported(timeout_s)
        return self._core.version

    async def metrics_actors(self) -> dict[str, Any]:
        """Pod name -> the handle of the metrics actor that scrapes it (for stats and tests)."""
        await self._ready()
        return {n: p.actor for n, p in self._core.pods.items()}

    async def metrics_actor_groups(self) -> dict[str, dict[str, Any]]:
        """Group -> {"actor": handle, "pods": [pod names]}."""
        await self._ready()
        return {
            g: {"actor": h, "pods": sorted(n for n, p in self._core.pods.items() if p.group == g)}
            for g, h in self._fleet.handles.items()
        }

    async def pin_response(self, response_id: str, pod: str | None) -> None:
        """Remember (or, with None, forget) which pod made a stored response."""
        self._pins.pin(response_id, pod) if pod is not None else self._pins.forget(response_id)

    async def response_pod(self, response_id: str) -> tuple[str | None, str | None]:
        """(the pod that made the response or None, that pod's state or None when it has left)."""
        pod = self._pins.pod_of(response_id)
        record = self._core.pods.get(pod) if pod is not None else None
        return pod, None if record is None else record.state.value

    async def debug_info(self) -> dict[str, Any]:
        """The actor's process and counters (for benchmarks)."""
        return {
            "pid": os.getpid(),
            "version": self._core.version,
            "pods": len(self._core.pods),
            "metrics_actors": len(self._fleet.handles),
            "restart_hold_s": None if self._held_s is None else round(self._held_s, 3),
        }

    async def shutdown(self) -> int:
        """Retire every metrics actor (they are detached: nothing else stops them); returns how many."""
        await self._ready()
        for task in self._tasks[2:]:  # the sources: nothing may add pods back
            task.cancel()
        async with self._lock:
            n = self._fleet.retire_all()
            self._core.pods.clear()
            self._core.bump()
            return n
