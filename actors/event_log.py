"""The profile actor's event log: the decisions and completions Serve request routers sent it, in
the order it applied them, so every router can follow the others' and keep its local mirror of the
profile (serve_app/llm_router/mirror.py) in step with the shared state.

A router sends its own events and asks for the others' since its cursor in one call (`page`). The
log keeps the last `limit` events: a router that starts late, or whose cursor fell out of the window,
or that finds a new `epoch` (the actor restarted and its state began empty), gets `reset` and
rebuilds its mirror from what the log still holds."""

from __future__ import annotations

import uuid
from collections import deque
from dataclasses import dataclass, field

from actors.protocol import ProfileEvent

DEFAULT_LOG_LIMIT = 20_000  # events kept (a decision carries the request's prompt: ~KBs each)
PAGE_LIMIT = 2_000  # events per page; a router far behind asks again


@dataclass(slots=True)
class LogPage:
    """Events after the asked cursor that came from other routers, and the cursor to ask with next.
    `reset`: the asked cursor is not in this log (another epoch, or too old): drop what was learned
    and apply these, which start at the oldest event kept. `more`: ask again at once."""

    epoch: str
    cursor: int
    events: list[ProfileEvent] = field(default_factory=list)
    reset: bool = False
    more: bool = False


class EventLog:
    def __init__(self, limit: int = DEFAULT_LOG_LIMIT) -> None:
        self.epoch = uuid.uuid4().hex[:12]  # new with every actor (a restart starts empty)
        self._entries: deque[tuple[int, str, ProfileEvent]] = deque(maxlen=limit)
        self._seq = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def seq(self) -> int:
        return self._seq

    def append(self, origin: str, event: ProfileEvent) -> None:
        self._seq += 1
        self._entries.append((self._seq, origin, event))

    def page(self, origin: str, epoch: str | None, cursor: int, limit: int = PAGE_LIMIT) -> LogPage:
        """The events after `cursor` that `origin` did not send itself (it applied those already)."""
        oldest = self._entries[0][0] if self._entries else self._seq + 1
        reset = epoch != self.epoch or cursor > self._seq or cursor < oldest - 1
        start = oldest - 1 if reset else cursor
        events: list[ProfileEvent] = []
        last = start
        skip = start - (oldest - 1)  # entries before the first to return
        for i in range(skip, len(self._entries)):
            seq, sender, event = self._entries[i]
            if len(events) >= limit:
                return LogPage(self.epoch, last, events, reset, more=True)
            last = seq
            if sender != origin or reset:  # after a reset a router relearns its own events too
                events.append(event)
        return LogPage(self.epoch, self._seq, events, reset)
