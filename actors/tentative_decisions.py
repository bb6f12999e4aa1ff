"""A profile actor's decisions that are made but not yet final: what its TentativePreRequest
plugins (the in-flight ledgers) count until the gateway's PreRequest for the request arrives.

Why: the gateway learns a decision when the actor's batch returns and tells the actors (PreRequest)
in a later batch, behind the calls that queued meanwhile. Every call in between used to be decided
on the same ledgers, so a burst (a flow-control dispatch pass, many clients at once) went to the one
endpoint that looked emptiest. Told at once, each call sees the ones decided before it, as the
in-process Scheduler's do.

The final PreRequest replaces the tentative entry (same request id); the gateway's `withdraw`
takes back one whose request failed before it was sent (another profile failed, the handler
refused); one that hears neither within `ttl_s` (its gateway replica died) is withdrawn then."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from scheduler.lifecycle import Lifecycle
from scheduler.types import LLMRequest, ProfileRunResult, SchedulingResult

TENTATIVE_TTL_S = 10.0  # the gateway's profile-call bound: a decision older than that was not used


class TentativeDecisions:
    __slots__ = ("_hooks", "_pending", "_profile", "clock", "expired", "told", "ttl_s", "withdrawn")

    def __init__(
        self,
        hooks: Lifecycle,
        profile_name: str,
        ttl_s: float = TENTATIVE_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._hooks = hooks
        self._profile = profile_name
        self.ttl_s = ttl_s
        self.clock = clock
        self._pending: OrderedDict[str, tuple[float, LLMRequest]] = OrderedDict()  # oldest first
        self.told = self.withdrawn = self.expired = 0

    def __len__(self) -> int:
        return len(self._pending)

    def counts(self) -> dict[str, int]:
        return {"held": len(self), "told": self.told, "withdrawn": self.withdrawn, "expired": self.expired}

    def tell(self, request: LLMRequest, result: ProfileRunResult | None) -> None:
        """This profile just decided `result` for `request`: its ledgers count it from now on."""
        if not self._hooks.takes_tentative or result is None or not result.target_endpoints:
            return
        now = self.clock()
        self._expire(now)
        self._hooks.tentative_pre_request(request, SchedulingResult({self._profile: result}, self._profile))
        self._pending.pop(request.request_id, None)
        self._pending[request.request_id] = (now + self.ttl_s, request)
        self.told += 1

    def settle(self, request_id: str) -> None:
        """The final PreRequest (or the response's end) arrived: the ledgers hold the real entry."""
        self._pending.pop(request_id, None)

    def withdraw(self, request: LLMRequest) -> None:
        """The request failed before it was sent: take back its tentative decision, if one is held."""
        if self._pending.pop(request.request_id, None) is not None:
            self._hooks.withdraw(request)
            self.withdrawn += 1

    def expire(self) -> None:
        """Withdraw what waited past `ttl_s` (before a batch decides on the ledgers)."""
        if self._pending:
            self._expire(self.clock())

    def _expire(self, now: float) -> None:
        while self._pending:
            request_id, (deadline, request) = next(iter(self._pending.items()))
            if deadline > now:
                return
            del self._pending[request_id]
            self._hooks.withdraw(request)
            self.expired += 1
