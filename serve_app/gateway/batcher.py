"""Coalesce concurrent calls to one actor method into one Ray call.

An actor call costs 1-4 ms here. A call goes out at once while fewer than `max_in_flight` are
under way; calls that arrive meanwhile wait and leave together when one returns. Low load pays no
added delay; high load pays one round trip per batch instead of one per request. Notifications
(no answer wanted) ride along with the next call, or leave on their own after `notify_delay_s`;
a lone notification never holds up a call, since more than one call may be in flight.

A failed batch of several items is sent again one item at a time (when `split_on(error)` says
the items, not the actor, may be at fault): one bad request fails alone, not its batch-mates."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any


class ActorBatcher:
    def __init__(
        self,
        send: Callable[[list[Any]], Any],
        max_in_flight: int = 2,
        max_batch: int = 256,
        notify_delay_s: float = 0.005,
        split_on: Callable[[BaseException], bool] = lambda err: True,
    ) -> None:
        self._send = send  # e.g. handle.run_batch.remote: returns an ObjectRef
        self._split_on = split_on
        self._max_in_flight = max_in_flight
        self._max_batch = max_batch
        self._notify_delay_s = notify_delay_s
        self._pending: list[tuple[Any, asyncio.Future | None]] = []
        self._in_flight = 0
        # Batches launched as tasks that have not reached `send` yet. An idle call may go out from
        # its own coroutine only when none is left, else it would overtake them (an event that was
        # leaving alone, applied after the call decided without it).
        self._unsent = 0
        self._flush_scheduled = False

    async def call(self, item: Any) -> Any:
        if self._in_flight < self._max_in_flight and not self._pending and not self._unsent:
            # Idle: send from this coroutine, without a task and a future in between.
            self._in_flight += 1
            try:
                return (await self._send([item]))[0]
            finally:
                self._in_flight -= 1
                self._maybe_launch()
        fut = asyncio.get_running_loop().create_future()
        self._pending.append((item, fut))
        self._maybe_launch()
        return await fut

    def notify(self, item: Any) -> None:
        """Fire-and-forget: the item rides with the next call, or leaves after notify_delay_s."""
        self._pending.append((item, None))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_later(self._notify_delay_s, self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        self._maybe_launch()

    def _maybe_launch(self) -> None:
        while self._pending and self._in_flight < self._max_in_flight:
            batch, self._pending = self._pending[: self._max_batch], self._pending[self._max_batch :]
            self._in_flight += 1
            self._unsent += 1
            asyncio.get_running_loop().create_task(self._run(batch))

    async def _run(self, batch: list[tuple[Any, asyncio.Future | None]]) -> None:
        self._unsent -= 1  # `send` is reached in this same step: tasks start in launch order
        try:
            await self._send_batch(batch)
        finally:
            self._in_flight -= 1
            self._maybe_launch()

    async def _send_batch(self, batch: list[tuple[Any, asyncio.Future | None]]) -> None:
        try:
            results = await self._send([item for item, _ in batch])
        except BaseException as err:
            if len(batch) > 1 and isinstance(err, Exception) and self._split_on(err):
                for one in batch:  # in order: events still apply before the calls after them
                    await self._send_batch([one])
                return
            # the actor died or the call was cancelled: fail this batch only
            for _, fut in batch:
                if fut is not None and not fut.done():
                    fut.set_exception(err if isinstance(err, Exception) else RuntimeError(repr(err)))
        else:
            for (_, fut), result in zip(batch, results or [None] * len(batch), strict=False):
                if fut is not None and not fut.done():
                    fut.set_result(result)
