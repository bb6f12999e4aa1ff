"""Requests waiting at a pod that stopped answering: moved to another pod before anything reached
the client.

A hung pod (stopped, deadlocked, its host unreachable) keeps its connections open. A stream is
retried elsewhere after `first_byte_timeout_s`, but a non-streamed answer comes whole at the end, so
nothing but `upstream_timeout_s` (600 s) bounds its wait, and a client with a shorter time-out of its
own loses the request. The datastore knows sooner: the pod fails its scrapes and is called
`unhealthy` after `unhealthy_after_failures` of them (about 5 s with the defaults).

So the forwarder registers each request while it waits for the pod's first byte (response headers;
for a non-streamed request, the whole answer). When a pod leaves this replica's view of the pool,
this asks the datastore, every `poll_s` while requests still wait there, what became of it: once it
is `unhealthy` they are cancelled and retried elsewhere, as a refused connection is. A pod that left
for any other reason (draining, removed, only its metrics stale) keeps them: the EPP does not cut a
request a working pod may still answer. Waiting costs nothing per request but a set entry."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from serve_app.gateway.endpoint_view import EndpointView

log = logging.getLogger("ray_epp.gateway")

POLL_S = 0.5


class PodLeft(Exception):
    """The pod this request waited at became unhealthy; nothing reached the client yet."""


class UnhealthyPods:
    def __init__(self, pod_status: Callable[[], Awaitable[list[dict[str, Any]]]], poll_s: float = POLL_S) -> None:
        self._pod_status = pod_status  # the datastore's `status()`: every pod's row with its state
        self._poll_s = poll_s
        self._waiting: dict[str, set[asyncio.Task]] = {}  # pod -> requests waiting for its first byte
        self._cancelled: set[asyncio.Task] = set()  # cancelled here, not by their client
        self._departed: set[str] = set()  # left the view; their fate not known yet
        self._watcher: asyncio.Task | None = None
        self.moved = 0  # requests moved off unhealthy pods

    @classmethod
    def following(cls, view: EndpointView) -> UnhealthyPods:
        """Told by `view` which pods leave and come back; asks its datastore for their state."""
        pods = cls(lambda: view.datastore.status.remote())
        view.on_change = pods.view_changed
        return pods

    @contextlib.contextmanager
    def waiting(self, pod: str) -> Iterator[None]:
        """Around the wait for `pod`'s first byte. A move surfaces as `PodLeft`."""
        task = asyncio.current_task()
        if task is None:
            yield
            return
        tasks = self._waiting.setdefault(pod, set())
        tasks.add(task)
        try:
            yield
        except asyncio.CancelledError:
            if task not in self._cancelled:
                raise
            self._cancelled.discard(task)
            task.uncancel()
            raise PodLeft(f"{pod} stopped answering (unhealthy: its scrapes fail) before it answered") from None
        finally:
            tasks.discard(task)
            if not tasks and self._waiting.get(pod) is tasks:
                del self._waiting[pod]

    def view_changed(self, left: Iterable[str], back: Iterable[str]) -> None:
        """From the endpoint view: pods that left the routable pool, and pods that are in it again."""
        self._departed.difference_update(back)
        self._departed.update(p for p in left if p in self._waiting)
        if self._departed and (self._watcher is None or self._watcher.done()):
            self._watcher = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        while self._departed:
            self._departed.intersection_update(self._waiting)  # nothing waits there any more
            if not self._departed:
                return
            try:
                rows = await self._pod_status()
            except Exception as err:  # the datastore restarting: ask again
                log.debug("unhealthy pods: datastore status failed: %s", err)
            else:
                states = {row["name"]: row["state"] for row in rows}
                for pod in [p for p in self._departed if states.get(p) == "unhealthy"]:
                    self._departed.discard(pod)
                    self._move(pod)
            await asyncio.sleep(self._poll_s)

    def _move(self, pod: str) -> None:
        tasks = self._waiting.get(pod, set())
        log.warning("pod %s is unhealthy: %d request(s) waiting for its first byte move to other pods", pod, len(tasks))
        for task in tasks:
            self._cancelled.add(task)
            task.cancel()
        self.moved += len(tasks)
