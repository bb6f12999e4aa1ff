"""The gateway replica's view of the pool, kept fresh by long-polling the datastore.

It serves admission (saturation), /ready, /v1/models and address look-ups without a per-request
call to the datastore."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from actors.protocol import as_served
from scheduler import Endpoint

log = logging.getLogger("ray_epp.gateway")


class EndpointView:
    def __init__(self, datastore: Any, watch_timeout_s: float = 5.0, models_every_s: float = 5.0) -> None:
        self._datastore = datastore
        self._watch_timeout_s = watch_timeout_s
        self._models_every_s = models_every_s
        self.version = 0
        self.endpoints: list[Endpoint] = []
        self.by_name: dict[str, Endpoint] = {}
        self.models: set[str] = set()
        self.adapters: set[str] = set()
        self._models_at = 0.0
        self._task: asyncio.Task | None = None
        self._first = asyncio.Event()

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
                version, endpoints = await self._datastore.watch.remote(self.version, self._watch_timeout_s)
                if version != self.version:
                    self.version = version
                    self.endpoints = endpoints = as_served(endpoints)
                    self.by_name = {ep.name: ep for ep in endpoints}
                    self.adapters = {
                        m for ep in endpoints for m in (*ep.metrics.active_models, *ep.metrics.waiting_models)
                    }
                if time.monotonic() - self._models_at > self._models_every_s or not self.models:
                    self.models = set(await self._datastore.models.remote())
                    self._models_at = time.monotonic()
                self._first.set()
            except asyncio.CancelledError:
                raise
            except Exception as err:  # datastore restarting: keep the last view, try again shortly
                log.warning("endpoint view: datastore watch failed: %s", err)
                await asyncio.sleep(0.2)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
