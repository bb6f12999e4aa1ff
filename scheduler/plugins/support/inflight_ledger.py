"""A ledger of work in flight per endpoint, kept from the scheduler's own decisions: what plugins
that count requests or tokens sent and not yet answered share (active-request, prefill-backlog);
a helper, not a plugin.

Each request adds an amount to one or more endpoints; releasing the request (its response came)
takes it back; a request never released is dropped after `timeout` seconds, so a lost response
can not hold an endpoint forever. Thread-safe: the gateway may report from several threads."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence


class InFlightLedger:
    __slots__ = ("_lock", "_requests", "_totals", "clock", "timeout")

    def __init__(self, timeout: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout = timeout
        self.clock = clock  # replaceable (tests, the simulation's virtual clock)
        self._lock = threading.Lock()
        # request id -> (expiry, ((endpoint name, amount), ...)); one timeout for all, so oldest first.
        self._requests: OrderedDict[str, tuple[float, Sequence[tuple[str, int]]]] = OrderedDict()
        self._totals: dict[str, int] = {}

    def __len__(self) -> int:
        """Requests counted and not yet released or expired (what a soak watches stay bounded)."""
        with self._lock:
            return len(self._requests)

    def totals(self) -> dict[str, int]:
        """The amount in flight per endpoint name (endpoints with none are absent)."""
        with self._lock:
            self._expire()
            return dict(self._totals)

    def add(self, request_id: str, amounts: Sequence[tuple[str, int]]) -> None:
        """Count a request; one scheduled again (a retry) replaces its earlier entry."""
        with self._lock:
            self._expire()
            self._drop(self._requests.pop(request_id, None))
            self._requests[request_id] = (self.clock() + self.timeout, amounts)
            for name, amount in amounts:
                self._totals[name] = self._totals.get(name, 0) + amount

    def release(self, request_id: str) -> None:
        """The request's work is done (unknown or already released ids are ignored)."""
        with self._lock:
            self._drop(self._requests.pop(request_id, None))
            self._expire()

    def _expire(self) -> None:
        now = self.clock()
        while self._requests:
            request_id, entry = next(iter(self._requests.items()))
            if entry[0] > now:
                break
            del self._requests[request_id]
            self._drop(entry)

    def _drop(self, entry: tuple[float, Sequence[tuple[str, int]]] | None) -> None:
        if entry is None:
            return
        for name, amount in entry[1]:
            left = self._totals.get(name, 0) - amount
            if left <= 0:
                self._totals.pop(name, None)
            else:
                self._totals[name] = left


class LedgerClock:
    """Mixin for plugins that keep an `InFlightLedger` as `self.ledger`: their `clock` is the
    ledger's, so whoever re-points plugin clocks (tests, the simulation) moves the ledger too."""

    ledger: InFlightLedger

    @property
    def clock(self) -> Callable[[], float]:
        return self.ledger.clock

    @clock.setter
    def clock(self, clock: Callable[[], float]) -> None:
        self.ledger.clock = clock
