"""One Ray call per scrape round: the reports of a metrics actor's scrapers, coalesced.

A Ray actor call costs milliseconds of CPU on each side whatever it carries, so the scrapers of one
process tick together (`actors/scrape_rules.py`, `after_scrape`) and their reports go out in one
`send(reports)` call."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from actors.scrape_report import ScrapeReport


class ReportAbandoned(Exception):
    """The call that carried a report was given up (see `ReportBatcher.abandon`): say it again."""


class ReportRound:
    """Counts the scrapes under way that may still report (see `PodScraper.scrape_once`)."""

    def __init__(self) -> None:
        self.busy = 0
        self._quiet: asyncio.Event | None = None

    def begin(self) -> None:
        self.busy += 1

    def end(self) -> None:
        self.busy -= 1
        if self.busy == 0 and self._quiet is not None:
            self._quiet.set()

    async def wait_quiet(self, max_wait_s: float) -> None:
        """Until no scrape is under way, or max_wait_s."""
        if self.busy <= 0 or max_wait_s <= 0:
            return
        self._quiet = quiet = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max_wait_s):
                await quiet.wait()
        self._quiet = None


class ReportBatcher(ReportRound):
    """Coalesces the reports of several scrapers into one `send(reports)` call.

    The scrapers of a process tick together and tell the batcher when a scrape begins and when it
    has queued its report or decided it has none (`ReportRound`): a call goes out as soon as every
    scrape of the round is through, or `max_wait_s` after the first report, with every report
    queued by then; reports queued while a call is in flight go in the next one (one call in flight
    at a time). `report()` queues at once and returns a future that completes when the call that
    carried the report has returned, or raises what that call raised, so each scraper keeps its own
    rules for what to say again after a lost report."""

    def __init__(self, send: Callable[[list[ScrapeReport]], Awaitable[Any]], max_wait_s: float) -> None:
        super().__init__()
        self._send = send
        self.max_wait_s = max_wait_s
        self._pending: list[tuple[ScrapeReport, asyncio.Future[None]]] = []
        self._task: asyncio.Task | None = None
        self._call: asyncio.Future[Any] | None = None  # the send in flight
        self.calls = 0
        self.entries = 0

    def report(self, entry: ScrapeReport) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._pending.append((entry, future))
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._flush())
        return future

    def abandon(self) -> None:
        """Give up the call in flight, e.g. to a datastore that restarted meanwhile (the dead
        incarnation never answers; the call would hold every later report until it times out): its
        reports fail with `ReportAbandoned`, and those queued behind it go out at once."""
        if self._call is not None:
            self._call.cancel()

    async def _flush(self) -> None:
        await self.wait_quiet(self.max_wait_s)
        while self._pending:
            batch, self._pending = self._pending, []
            self.calls += 1
            self.entries += len(batch)
            self._call = call = asyncio.ensure_future(self._send([entry for entry, _ in batch]))
            try:
                await asyncio.wait({call})
            except asyncio.CancelledError:
                call.cancel()
                for _, future in batch:
                    future.cancel()
                raise
            finally:
                self._call = None
            error = ReportAbandoned("the report call was given up") if call.cancelled() else call.exception()
            for _, future in batch:
                if future.done():
                    continue
                if error is None:
                    future.set_result(None)
                else:
                    future.set_exception(error)

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        for _, future in self._pending:
            future.cancel()
        self._pending = []
