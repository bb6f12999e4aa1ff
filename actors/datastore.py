"""The registry of model servers and their latest metrics: one named async actor.

Readers never poll it per request: `watch(since_version, timeout_s)` returns as soon as the routable
snapshot changed (or at the timeout), so profile actors and gateway replicas keep a local copy.

Health. A pod is `starting` until its first report, `ready` while its last successful report is
younger than `staleness_threshold_s` (metrics actors report at least every `heartbeat_s`),
`stale` after that, and `unhealthy` after `unhealthy_after_failures` consecutive failed scrapes.
Only `ready` pods are in the snapshot; a pod that recovers is re-admitted by its next report. A
periodic check notices staleness without waiting for a report.

Versions. A version increases on every change of the snapshot or of the pod set. A successful
report is a change even when the values are the same: the pod's `update_time` (its scrape time) is
newer, and readers may judge freshness by it; metrics actors report unchanged pods every
`heartbeat_s`, so a snapshot's update_times are at most about that old. The first version
of an incarnation is the wall clock in microseconds, so versions keep increasing across a restart
and a reader's `since_version` from before the restart is answered at once.

Metrics actors. One `NodeMetricsActor` scrapes the pods of one Ray node (the pod's address is the
node's IP; loopback pods belong to the datastore's node; pods on no Ray node form the group `any`),
at most `max_pods_per_metrics_actor` pods each (more get `<group>#2`, ...). It sends one
`report_batch` per scrape round with what changed, and the datastore bumps the version once per
batch. (DESIGN.md's first design had one actor per pod; a Ray call and an actor process each cost
enough CPU that on a small machine that competed with the model servers: bench/metrics_path_cpu.py.)

Restart. The datastore is created with max_restarts=-1. Its metrics actors are detached and named
`<datastore name>:metrics:<group>`, so they outlive it; a restarted datastore (Ray re-runs the
constructor) rebuilds its pod list from the metrics actors it finds by name (each says which pods it
scrapes), ignoring the constructor's list (which may be out of date after add/remove), and asks each
to re-send its state. Lost in a restart: the metrics until the next scrape (≈50 ms), the version
sequence (a new, larger one starts), and how long each pod has been known. A first start (not a
restart) kills leftover metrics actors of the same datastore name and starts from the constructor's
list. A restarted metrics actor asks the datastore for its current pod list
(`pods_of_metrics_actor`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import ActorDiedError

from actors.options import ActorOptions, PodSpec, as_options, as_pod
from actors.placement import affinity_for, is_loopback, node_ids_by_ip
from actors.pod_metrics import NodeMetricsActor, ReportEntry
from scheduler import Endpoint, Metrics

log = logging.getLogger("ray_epp.actors.datastore")

STARTING, READY, STALE, UNHEALTHY = "starting", "ready", "stale", "unhealthy"


def metrics_actor_prefix(datastore_name: str) -> str:
    return f"{datastore_name}:metrics:"


def metrics_actor_name(datastore_name: str, pod_name: str) -> str:
    return metrics_actor_prefix(datastore_name) + pod_name


@dataclass(slots=True)
class _Pod:
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
    state: str = STARTING


class DatastoreCore:
    """The datastore's state and rules, without Ray (the actor adds metrics-actor management)."""

    def __init__(self, options: ActorOptions) -> None:
        self.options = options
        self.pods: dict[str, _Pod] = {}
        self.version = time.time_ns() // 1000
        self._changed = asyncio.Event()
        self._snapshot_version = -1
        self._snapshot: list[Endpoint] = []

    # --- versions and snapshots ----------------------------------------------------------------

    def bump(self) -> None:
        self.version += 1
        self._changed.set()
        self._changed = asyncio.Event()

    def snapshot(self) -> tuple[int, list[Endpoint]]:
        if self._snapshot_version != self.version:
            self._snapshot = [
                Endpoint(p.spec.name, p.spec.address, p.spec.port, dict(p.spec.labels), p.metrics)
                for p in self.pods.values()
                if p.state == READY and p.metrics is not None
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

    def state_of(self, pod: _Pod, now: float) -> str:
        if pod.consecutive_failures >= self.options.unhealthy_after_failures:
            return UNHEALTHY
        if pod.last_seen is None:
            return STARTING if now - pod.added <= self.options.staleness_threshold_s else STALE
        if now - pod.last_seen > self.options.staleness_threshold_s:
            return STALE
        return READY

    def refresh_states(self) -> bool:
        """Recompute every pod's state; bump the version when one changed."""
        now = time.monotonic()
        changed = False
        for pod in self.pods.values():
            state = self.state_of(pod, now)
            if state != pod.state:
                log.info("pod %s: %s -> %s", pod.spec.name, pod.state, state)
                pod.state = state
                changed = True
        if changed:
            self.bump()
        return changed

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

    def report_batch(self, entries: list[ReportEntry]) -> int:
        """Several scrape outcomes, one version bump at most; returns how many pods were known."""
        known = 0
        changed = False
        for name, metrics, error, consecutive, total in entries:
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
        else:
            pod.consecutive_failures = (
                consecutive_failures if consecutive_failures is not None else pod.consecutive_failures + 1
            )
            pod.last_error = error or "scrape failed"
        if total_failures is not None:
            pod.total_failures = total_failures
        elif metrics is None or error is not None:
            pod.total_failures += 1
        state = self.state_of(pod, now)
        if state != pod.state:
            log.info("pod %s: %s -> %s%s", name, pod.state, state, f" ({pod.last_error})" if state == UNHEALTHY else "")
            pod.state = state
            return True, True
        return True, changed and state == READY

    def report_models(self, name: str, models: list[str]) -> bool:
        pod = self.pods.get(name)
        if pod is None:
            return False
        pod.models = sorted(set(models))
        return True

    def models(self) -> list[str]:
        """Model ids served by pods that are not unhealthy (base models and LoRA adapters)."""
        ids: set[str] = set()
        for pod in self.pods.values():
            if pod.state != UNHEALTHY:
                ids.update(pod.models)
        return sorted(ids)

    def status(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        rows = []
        for pod in self.pods.values():
            rows.append(
                {
                    "name": pod.spec.name,
                    "address": pod.spec.address,
                    "port": pod.spec.port,
                    "labels": dict(pod.spec.labels),
                    "state": pod.state,
                    "routable": pod.state == READY,
                    "consecutive_failures": pod.consecutive_failures,
                    "total_failures": pod.total_failures,
                    "reports": pod.reports,
                    "last_error": pod.last_error,
                    "last_update_age_s": None if pod.last_seen is None else round(now - pod.last_seen, 3),
                    "served_models": list(pod.models),
                    "metrics": None if pod.metrics is None else pod.metrics.to_json(),
                }
            )
        return rows


@ray.remote
class DatastoreActor:
    """The named datastore actor (default name "epp-datastore"); see the module doc."""

    def __init__(
        self,
        pods: list[dict[str, Any] | PodSpec] | None = None,
        options: dict[str, Any] | ActorOptions | None = None,
        name: str | None = None,
        namespace: str | None = None,
    ) -> None:
        self._options = as_options(options)
        self._name = name or self._options.datastore_name
        self._namespace = namespace or ray.get_runtime_context().namespace
        self._core = DatastoreCore(self._options)
        self._initial = [as_pod(p) for p in pods or []]
        self._restarted = ray.get_runtime_context().was_current_actor_reconstructed
        self._bootstrapped = asyncio.Event()
        self._bootstrap_error: str | None = None
        self._lock = asyncio.Lock()
        self._groups: dict[str, Any] = {}  # metrics actor group -> its handle
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._bootstrap()), loop.create_task(self._check_loop())]

    # --- start-up and rebuild ------------------------------------------------------------------

    async def _bootstrap(self) -> None:
        try:
            async with self._lock:
                found = await self._find_metrics_actors()
                alive = [(group, handle, specs) for group, handle, specs in found if specs is not None]
                if self._restarted and alive:
                    log.warning("datastore %s restarted: rebuilding from %d metrics actors", self._name, len(alive))
                    for group, handle, specs in alive:
                        self._groups[group] = handle
                        for spec in specs:
                            if spec.name not in self._core.pods:
                                self._core.pods[spec.name] = _Pod(spec, handle, group)
                        with contextlib.suppress(Exception):
                            handle.resync.remote()
                    self._core.bump()
                else:
                    for _, handle, _ in found:  # leftovers of an earlier datastore of this name
                        with contextlib.suppress(Exception):
                            ray.kill(handle, no_restart=True)
                    await self._reconcile(self._initial, remove_missing=True)
        except Exception as err:
            self._bootstrap_error = f"{type(err).__name__}: {err}"
            log.exception("datastore %s failed to start: %s", self._name, err)
        finally:
            self._bootstrapped.set()

    async def _find_metrics_actors(self) -> list[tuple[str, Any, list[PodSpec] | None]]:
        """(group, handle, the pods it scrapes; None when it does not answer) of every metrics actor
        named after this datastore."""
        prefix = metrics_actor_prefix(self._name)
        named = await asyncio.to_thread(ray.util.list_named_actors, all_namespaces=True)
        found: list[tuple[str, Any, list[PodSpec] | None]] = []
        for entry in named:
            if entry.get("namespace") != self._namespace or not entry.get("name", "").startswith(prefix):
                continue
            try:
                handle = ray.get_actor(entry["name"], namespace=self._namespace)
            except Exception:  # gone meanwhile
                continue
            try:
                specs = [as_pod(s) for s in await asyncio.wait_for(handle.pod_specs.remote(), timeout=10.0)]
            except Exception as err:  # dead, dying, or of another kind: not a group of ours any more
                log.warning("ignoring metrics actor %s: %s", entry["name"], err)
                specs = None
            found.append((entry["name"][len(prefix) :], handle, specs))
        return found

    async def _ready(self) -> None:
        if not self._bootstrapped.is_set():
            await self._bootstrapped.wait()

    async def _check_loop(self) -> None:
        while True:
            await asyncio.sleep(self._options.check_interval_s)
            try:
                self._core.refresh_states()
            except Exception as err:  # keep checking
                log.exception("state check failed: %s", err)

    # --- metrics actors ------------------------------------------------------------------------

    def _group_for(self, spec: PodSpec, node_ids: dict[str, str]) -> str:
        """The metrics actor group of a pod that has none yet: its Ray node's IP (a loopback
        address is this node), or `any`; the first shard of that with room."""
        if spec.address in node_ids:
            base = spec.address
        elif is_loopback(spec.address):
            local = ray.get_runtime_context().get_node_id()
            base = next((ip for ip, node_id in node_ids.items() if node_id == local), "local")
        else:
            base = "any"
        sizes: dict[str, int] = {}
        for pod in self._core.pods.values():
            sizes[pod.group] = sizes.get(pod.group, 0) + 1
        shard = 1
        while True:
            group = base if shard == 1 else f"{base}#{shard}"
            if sizes.get(group, 0) < self._options.max_pods_per_metrics_actor:
                return group
            shard += 1

    async def _create_metrics_actor(self, group: str, specs: list[PodSpec], node_ids: dict[str, str] | None) -> Any:
        name = metrics_actor_name(self._name, group)
        if node_ids is None:
            node_ids = node_ids_by_ip(await asyncio.to_thread(ray.nodes))
        opts: dict[str, Any] = {
            "name": name,
            "namespace": self._namespace,
            "lifetime": "detached",
            "max_restarts": -1,
            "num_cpus": self._options.metrics_num_cpus,
        }
        strategy = affinity_for(specs[0].address, node_ids, ray.get_runtime_context().get_node_id())
        if strategy is not None:
            opts["scheduling_strategy"] = strategy
        me = ray.get_runtime_context().current_actor
        deadline = time.monotonic() + 10.0
        dumped = [s.model_dump() for s in specs]
        while True:
            try:
                return NodeMetricsActor.options(**opts).remote(dumped, me, self._options.model_dump(), group)
            except ValueError:  # the name is still taken: a retired actor that is not dead yet, or a leftover
                if time.monotonic() > deadline:
                    raise
                with contextlib.suppress(Exception):
                    ray.kill(ray.get_actor(name, namespace=self._namespace), no_restart=True)
                await asyncio.sleep(0.2)

    async def _sync_group(self, group: str, node_ids: dict[str, str] | None = None) -> None:
        """Make the group's metrics actor scrape exactly the group's pods: create it, tell it the
        new list, or retire it when the group is empty."""
        members = [p for p in self._core.pods.values() if p.group == group]
        handle = self._groups.get(group)
        if not members:
            if handle is not None:
                with contextlib.suppress(Exception):
                    ray.kill(handle, no_restart=True)
                del self._groups[group]
            return
        specs = [p.spec for p in members]
        if handle is not None:
            try:
                await asyncio.wait_for(handle.set_pods.remote([s.model_dump() for s in specs]), timeout=30.0)
            except ActorDiedError:
                handle = None  # killed for good (by hand?): start a new one
            except Exception as err:  # restarting: a restarted metrics actor asks for its pods itself
                log.warning("metrics actor %s did not take its pod list: %s", group, err)
        if handle is None:
            handle = await self._create_metrics_actor(group, specs, node_ids)
            self._groups[group] = handle
        for pod in members:
            pod.actor = handle

    async def _reconcile(self, specs: list[PodSpec], remove_missing: bool) -> dict[str, list[str]]:
        wanted = {s.name: s for s in specs}
        if len(wanted) != len(specs):
            dupes = sorted({s.name for s in specs if sum(t.name == s.name for t in specs) > 1})
            raise ValueError(f"pod names must be unique, repeated: {dupes}")
        added, removed, replaced = [], [], []
        touched: set[str] = set()
        node_ids: dict[str, str] | None = None
        if any(self._core.pods.get(n) is None or self._core.pods[n].spec != s for n, s in wanted.items()):
            node_ids = node_ids_by_ip(await asyncio.to_thread(ray.nodes))
        for name, spec in wanted.items():
            pod = self._core.pods.get(name)
            if pod is not None and pod.spec == spec:
                continue
            if pod is not None:
                del self._core.pods[name]  # placed again below: its address may have moved
                touched.add(pod.group)
                replaced.append(name)
            else:
                added.append(name)
            group = self._group_for(spec, node_ids or {})
            self._core.pods[name] = _Pod(spec, None, group)
            touched.add(group)
        if remove_missing:
            for name in [n for n in self._core.pods if n not in wanted]:
                touched.add(self._core.pods.pop(name).group)
                removed.append(name)
        for group in sorted(touched):
            await self._sync_group(group, node_ids)
        if added or removed or replaced:
            self._core.bump()
        return {"added": added, "removed": removed, "replaced": replaced}

    # --- the API -------------------------------------------------------------------------------

    async def ping(self) -> int:
        """The current version once the datastore has started (raises if start-up failed)."""
        await self._ready()
        if self._bootstrap_error is not None:
            raise RuntimeError(f"datastore {self._name} failed to start: {self._bootstrap_error}")
        return self._core.version

    async def snapshot(self) -> tuple[int, list[Endpoint]]:
        """(version, routable endpoints): healthy pods with fresh metrics."""
        await self._ready()
        return self._core.snapshot()

    async def watch(self, since_version: int, timeout_s: float) -> tuple[int, list[Endpoint]]:
        """Like snapshot(), but waits until the version is newer than `since_version` (or timeout_s)."""
        await self._ready()
        return await self._core.watch(since_version, timeout_s)

    async def status(self) -> list[dict[str, Any]]:
        """Every pod: state (ready / stale / unhealthy / starting), failures, age of its last report,
        served models, metrics."""
        await self._ready()
        return self._core.status()

    async def models(self) -> list[str]:
        await self._ready()
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

    async def report_batch(self, entries: list[ReportEntry]) -> int:
        """From a metrics actor: (pod, metrics, error, consecutive failures, total failures) per pod
        it has something to say about; one version bump at most. Returns how many pods are known."""
        await self._ready()
        return self._core.report_batch(entries)

    async def pods_of_metrics_actor(self, group: str) -> list[dict[str, Any]] | None:
        """What the metrics actor of `group` should scrape (it asks after a restart); None when the
        group is retired."""
        await self._ready()
        if group not in self._groups:
            return None
        return [p.spec.model_dump() for p in self._core.pods.values() if p.group == group]

    async def report_models(self, name: str, models: list[str]) -> bool:
        await self._ready()
        return self._core.report_models(name, models)

    async def add_pod(self, spec: dict[str, Any] | PodSpec) -> dict[str, list[str]]:
        """Add a pod (or replace one of the same name whose address, port or labels changed)."""
        await self._ready()
        async with self._lock:
            return await self._reconcile([as_pod(spec)], remove_missing=False)

    async def remove_pod(self, name: str) -> bool:
        await self._ready()
        async with self._lock:
            pod = self._core.pods.pop(name, None)
            if pod is None:
                return False
            self._core.bump()
            await self._sync_group(pod.group)
            return True

    async def set_pods(self, specs: list[dict[str, Any] | PodSpec]) -> dict[str, list[str]]:
        """Make the pod set exactly `specs`: start, replace and retire metrics actors."""
        await self._ready()
        async with self._lock:
            return await self._reconcile([as_pod(s) for s in specs], remove_missing=True)

    async def wait_settled(self, timeout_s: float) -> int:
        """Wait until every pod was reported on once (scraped, or failed), or timeout_s; returns the
        version then. (Not "until none is `starting`": a pod whose metrics actor is slow to start
        goes from starting to stale without a report.)"""
        await self._ready()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(p.reports > 0 for p in self._core.pods.values()):
                break
            await asyncio.sleep(0.02)
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
            for g, h in self._groups.items()
        }

    async def debug_info(self) -> dict[str, Any]:
        """The actor's process and counters (for benchmarks)."""
        return {
            "pid": os.getpid(),
            "version": self._core.version,
            "pods": len(self._core.pods),
            "metrics_actors": len(self._groups),
        }

    async def shutdown(self) -> int:
        """Retire every metrics actor (they are detached: nothing else stops them); returns how many."""
        await self._ready()
        async with self._lock:
            for handle in self._groups.values():
                with contextlib.suppress(Exception):
                    ray.kill(handle, no_restart=True)
            n = len(self._groups)
            self._groups.clear()
            self._core.pods.clear()
            self._core.bump()
            return n
