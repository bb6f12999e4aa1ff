"""Which pod made a stored response (the Responses API's `previous_response_id`): a bounded map
with a time to live, kept by the datastore actor so that every gateway replica reads the same
pins. A model server keeps its responses in its own store, so a follow-up must reach that pod.

No Ray here: the datastore actor owns one `ResponsePins` and answers for it."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

DEFAULT_MAX_PINS = 100_000
DEFAULT_TTL_S = 3600.0


class ResponsePins:
    """response id → pod name, oldest dropped first once `max_pins` are held, each forgotten
    `ttl_s` after it was pinned (a server's store is not kept forever either)."""

    def __init__(
        self,
        max_pins: int = DEFAULT_MAX_PINS,
        ttl_s: float = DEFAULT_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._pins: OrderedDict[str, tuple[str, float]] = OrderedDict()
        self._max, self._ttl, self._clock = max_pins, ttl_s, clock

    def pin(self, response_id: str, pod: str) -> None:
        self._pins[response_id] = (pod, self._clock() + self._ttl)
        self._pins.move_to_end(response_id)
        while len(self._pins) > self._max:
            self._pins.popitem(last=False)

    def forget(self, response_id: str) -> None:
        self._pins.pop(response_id, None)

    def pod_of(self, response_id: str) -> str | None:
        entry = self._pins.get(response_id)
        if entry is None:
            return None
        if entry[1] <= self._clock():
            del self._pins[response_id]
            return None
        return entry[0]

    def __len__(self) -> int:
        return len(self._pins)
