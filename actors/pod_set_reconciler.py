"""Changes to the datastore's pod set, made under the datastore's lock: who may change a pod (its
owner: static, run-time or a managed source), adding, replacing, removing and draining pods, and
then making the metrics actors match (actors/metrics_groups.py plans where each pod is scraped).
Apart from the actor so its API and its start-up read on their own."""

from __future__ import annotations

import asyncio
import logging
import time

import ray

from actors.datastore_core import DatastoreCore
from actors.metrics_fleet import MetricsFleet
from actors.metrics_groups import by_name, plan_pod_set, to_place
from actors.options import ActorOptions, PodSpec
from actors.placement import RayNodes
from actors.pod_source import PodConflict, PodSource
from actors.pod_state import PodRecord

log = logging.getLogger("ray_epp.actors.datastore")


class PodSetReconciler:
    """The datastore's pod set (`core.pods`) and its metrics actors (`fleet`), changed together;
    `sources` are the managed pod sources, whose pods no other owner may change."""

    def __init__(
        self, core: DatastoreCore, fleet: MetricsFleet, sources: dict[str, PodSource], options: ActorOptions
    ) -> None:
        self.core, self.fleet, self.sources, self.options = core, fleet, sources, options

    async def finish_drains(self) -> None:
        """Drained pods leave the pod set (their metrics actors stop scraping them)."""
        done = self.core.drained()
        groups = set()
        for name, why in done.items():
            pod = self.core.pods.pop(name)
            groups.add(pod.group)
            log.info("pod %s drained (%s, after %.1f s): removed", name, why, time.monotonic() - pod.draining_since)
        for group in sorted(groups):
            await self.sync_group(group)
        if done:
            self.core.bump()

    async def sync_group(self, group: str, nodes: RayNodes | None = None) -> None:
        members = [p for p in self.core.pods.values() if p.group == group]
        handle = await self.fleet.sync(group, [p.spec for p in members], nodes)
        for pod in members:
            pod.actor = handle

    def check_owner(self, names: list[str], source: str) -> None:
        """`source` may change these pods: none is owned by another managed source (unless it is
        only draining there)."""
        for name in names:
            pod = self.core.pods.get(name)
            owner = pod.source if pod is not None else ""
            if owner != source and owner in self.sources and pod.draining_since is None:
                raise PodConflict(f"pod {name!r} belongs to pod source {owner}; change it there")

    async def set_unmanaged(self, specs: list[PodSpec], source: str, drain: bool) -> dict[str, list[str]]:
        """Make the pods no managed source owns exactly `specs`."""
        wanted = by_name(specs)
        gone = [n for n, p in self.core.pods.items() if p.source not in self.sources and n not in wanted]
        return await self.reconcile(specs, source=source, remove=gone, drain=drain)

    async def reconcile(
        self, specs: list[PodSpec], *, source: str, remove: list[str], drain: bool
    ) -> dict[str, list[str]]:
        """Add or replace `specs` as pods of `source` and remove (or drain) the pods named in
        `remove`; then make the metrics actors match. A wanted pod that was draining is wanted
        again; a relabelled pod (same address and port) keeps its metrics and stays routable."""
        pods = self.core.pods
        wanted = by_name(specs)
        self.check_owner(list(wanted), source)
        if not drain:
            self.check_owner(remove, source)
        keep = {n: p.spec for n, p in pods.items() if drain or n not in remove}
        full = {**keep, **wanted}
        nodes: RayNodes | None = None
        if to_place({n: p.spec for n, p in pods.items()}, full):
            nodes = RayNodes.of(await asyncio.to_thread(ray.nodes))
        change = plan_pod_set(
            {n: (p.spec, p.group) for n, p in pods.items()},
            full,
            remove_missing=True,
            nodes=nodes or RayNodes(),
            local_node_id=ray.get_runtime_context().get_node_id(),
            max_pods=self.options.max_pods_per_metrics_actor,
            scope=self.options.metrics_actor_scope,
        )
        changed = change.changed
        for name, group in change.placed.items():
            old = pods.pop(name, None)  # a replaced pod is placed again: its address may have moved
            record = PodRecord(full[name], None, group, source=source)
            if old is not None and (old.spec.address, old.spec.port) == (record.spec.address, record.spec.port):
                record.metrics, record.last_seen, record.reports, record.models = (
                    old.metrics,
                    old.last_seen,
                    old.reports,
                    old.models,
                )
                record.added, record.consecutive_failures = old.added, old.consecutive_failures
                record.state = record.health(time.monotonic(), self.options)
            pods[name] = record
        for name in change.removed:
            del pods[name]
        for name in wanted:
            pods[name].source = source
            changed = self.core.end_drain(name) or changed
        draining = []
        if drain:
            for name in remove:
                if self.core.begin_drain(name):
                    draining.append(name)
        for group in sorted(change.touched):
            await self.sync_group(group, nodes)
        if changed:
            self.core.bump()
        return {"added": change.added, "removed": change.removed, "replaced": change.replaced, "draining": draining}
