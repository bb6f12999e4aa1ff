"""The gateway replica's view of the pool, kept fresh by long-polling the datastore.

It serves admission (saturation), /ready, /v1/models and address look-ups without a per-request
call to the datastore. It follows snapshot deltas (actors/snapshot_delta.py): only what changed
since the version it holds, from its node's snapshot relay when the datastore runs relays
(actors/pool_feed.py); `deltas=False` takes the full pool from the datastore each time
(benchmarks compare)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from actors.pool_feed import PoolFeed
from actors.protocol import as_served
from actors.snapshot_delta import PoolCopy
from scheduler import Endpoint

log = logging.getLogger("ray_epp.gateway")


class EndpointView:
    def __init__(
        self,
        datastore: Any,
        watch_timeout_s: float = 5.0,
        models_every_s: float = 5.0,
        deltas: bool = True,
        min_interval_s: float = 0.0,
    ) -> None:
        """`min_interval_s`: after taking a version, wait this long before asking for the next
        (bounds a replica's watch calls when the pool changes every few ms: docs/SCALING.md)."""
        self._datastore = datastore
        self._min_interval_s = min_interval_s
        self._pool = PoolCopy() if deltas else None
        self._feed = PoolFeed()  # this node's snapshot relay when the datastore runs them
        self._watch_timeout_s = watch_timeout_s
        self._models_every_s = models_every_s
        self.version = 0
        self.adopted_at = 0.0  # monotonic time the view last took a new version (0: never)
        self.endpoints: list[Endpoint] = []
        self.by_name: dict[str, Endpoint] = {}
        self.models: set[str] = set()
        self.adapters: set[str] = set()
        self._models_at = 0.0
        self._task: asyncio.Task | None = None
        self._first = asyncio.Event()
        # Told which pods left the pool and which came back (serve_app/gateway/unhealthy_pods.py).
        self.on_change: Callable[[Iterable[str], Iterable[str]], None] | None = None
        self._names: frozenset[str] = frozenset()

    @property
    def datastore(self) -> Any:
        """The datastore actor's handle this view follows."""
        return self._datastore

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    @property
    def has_first(self) -> bool:
        """Whether a snapshot has arrived since start()."""
        return self._first.is_set()

    async def wait_first(self, timeout_s: float) -> bool:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._first.wait(), timeout_s)
        return self._first.is_set()

    async def _loop(self) -> None:
        while True:
            try:
                if self._pool is not None:
                    changed = await self._follow_delta()
                else:
                    version, endpoints = await self._datastore.watch.remote(self.version, self._watch_timeout_s)
                    changed = version != self.version
                    if changed:
                        self._adopt(version, as_served(endpoints), None)
                if time.monotonic() - self._models_at > self._models_every_s or not self.models:
                    self.models = set(await self._datastore.models.remote())
                    self._models_at = time.monotonic()
                self._first.set()
                if changed and self._min_interval_s:
                    await asyncio.sleep(self._min_interval_s)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # datastore restarting: keep the last view, try again shortly
                log.warning("endpoint view: datastore watch failed: %s", err)
                await asyncio.sleep(0.2)

    async def _follow_delta(self) -> bool:
        pool = self._pool
        packed = await self._feed.next(self._datastore, pool.version, self._watch_timeout_s)
        delta = pool.apply(packed)
        if delta is None:
            return False
        as_served(delta.endpoints)  # only the new objects: the others were served already
        self._adopt(pool.version, pool.endpoints, pool.by_name)
        return True

    def _adopt(self, version: int, endpoints: list[Endpoint], by_name: dict[str, Endpoint] | None) -> None:
        self.version = version
        self.adopted_at = time.monotonic()
        self.endpoints = endpoints
        self.by_name = by_name if by_name is not None else {ep.name: ep for ep in endpoints}
        if self.on_change is not None:
            names = frozenset(self.by_name)
            if names != self._names:
                self.on_change(self._names - names, names - self._names)
            self._names = names
        self.adapters = {m for ep in endpoints for m in (*ep.metrics.active_models, *ep.metrics.waiting_models)}
        # A model a routable pod has just listed is known at once, not at the next models refresh.
        listed = {m.id for ep in endpoints if ep.served_models for m in ep.served_models}
        if not listed <= self.models:
            self.models = self.models | listed

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        await self._feed.close()
