"""A datastore's metrics actors, by group: found by name (after a restart), created, told their pod
lists, retired. Which pods form a group is decided in `actors/metrics_groups.py`.

The actors are detached and named `<datastore name>:metrics:<group>`, with max_restarts=-1, so
they outlive a datastore restart; a retired one is killed for good."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import ray
from ray.exceptions import ActorDiedError

from actors.metrics_actor import NodeMetricsActor
from actors.metrics_groups import metrics_actor_name, metrics_actor_prefix, pod_node
from actors.options import ActorOptions, PodSpec, as_pod
from actors.placement import RayNodes, affinity, placed_cpus

log = logging.getLogger("ray_epp.actors.datastore")

Found = tuple[str, Any, list[PodSpec] | None]  # group, handle, the pods it scrapes (None: no answer)


class MetricsFleet:
    def __init__(self, datastore_name: str, namespace: str, options: ActorOptions) -> None:
        self._name = datastore_name
        self._namespace = namespace
        self._options = options
        self.handles: dict[str, Any] = {}  # group -> its metrics actor

    async def find(self) -> list[Found]:
        """(group, handle, the pods it scrapes; None when it does not answer) of every metrics actor
        named after this datastore."""
        prefix = metrics_actor_prefix(self._name)
        named = await asyncio.to_thread(ray.util.list_named_actors, all_namespaces=True)
        found: list[Found] = []
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

    async def sync(self, group: str, specs: list[PodSpec], nodes: RayNodes | None = None) -> Any:
        """Make the group's metrics actor scrape exactly `specs`: create it, tell it the new list,
        or retire it when `specs` is empty (then None). Returns its handle."""
        handle = self.handles.get(group)
        if not specs:
            if handle is not None:
                kill(handle)
                del self.handles[group]
            return None
        if handle is not None:
            try:
                await asyncio.wait_for(handle.set_pods.remote([s.model_dump() for s in specs]), timeout=30.0)
            except ActorDiedError:
                handle = None  # killed for good (by hand?): start a new one
            except Exception as err:  # restarting: a restarted metrics actor asks for its pods itself
                log.warning("metrics actor %s did not take its pod list: %s", group, err)
        if handle is None:
            handle = await self._create(group, specs, nodes)
            self.handles[group] = handle
        return handle

    async def _create(self, group: str, specs: list[PodSpec], nodes: RayNodes | None) -> Any:
        name = metrics_actor_name(self._name, group)
        if nodes is None:
            nodes = RayNodes.of(await asyncio.to_thread(ray.nodes))
        opts: dict[str, Any] = {
            "name": name,
            "namespace": self._namespace,
            "lifetime": "detached",
            "max_restarts": -1,
            "num_cpus": self._options.metrics_num_cpus,
        }
        # the group's pods share a node (or, in group `any`, none): the first one's is the group's
        strategy = affinity(pod_node(specs[0], nodes, ray.get_runtime_context().get_node_id()))
        if strategy is not None:
            opts["scheduling_strategy"] = strategy
            opts["num_cpus"] = placed_cpus(self._options.metrics_num_cpus, strategy)
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

    def retire_all(self) -> int:
        """Kill every metrics actor for good (they are detached: nothing else stops them)."""
        for handle in self.handles.values():
            kill(handle)
        n = len(self.handles)
        self.handles.clear()
        return n


def kill(handle: Any) -> None:
    """Kill a metrics actor for good, if it is still there."""
    with contextlib.suppress(Exception):
        ray.kill(handle, no_restart=True)
