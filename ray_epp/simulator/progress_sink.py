"""How the engine loop hands a request's progress to the HTTP handler waiting on it: a sink per
request, fed by the loop after each step (an output count, or None when it finished)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ray_epp.simulator.engine_request import EngineRequest


class ProgressSink:
    """Where the engine loop delivers one request's progress: its output count (None: finished)
    on its own queue, or, for one choice of several (`index`), `(index, count)` on a queue the
    choices share."""

    __slots__ = ("done", "index", "queue")

    def __init__(self, stream: bool, queue: asyncio.Queue[Any] | None = None, index: int | None = None) -> None:
        self.queue: asyncio.Queue[Any] | None = queue if queue is not None else asyncio.Queue() if stream else None
        self.index = index
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def _put(self, count: int | None) -> None:
        if self.queue is not None:
            self.queue.put_nowait(count if self.index is None else (self.index, count))

    def emit(self, r: EngineRequest) -> None:
        self._put(r.num_output)

    def finish(self) -> None:
        self._put(None)
        if not self.done.done():
            self.done.set_result(None)
