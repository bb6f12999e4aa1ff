"""A profile actor and its standby on another Ray node, seen by a gateway replica as one link
(docs/DESIGN.md, "Profile standbys").

The active actor (the primary while it answers) gets the batches: the calls that decide and the
events (PreRequest, first token, ResponseComplete, withdraw) that feed its stateful plugins. The
other gets the same events, in order, a few milliseconds later (`MIRROR_DELAY_S`), so its prefix
index and in-flight ledgers stay warm. A batch the active actor fails because it is gone (its
process or its node died), or does not answer within `failover_after_s`, is sent again, its calls
only (the events already went to the survivor), to the other actor within the rest of the
request's budget; the gone one is then left out until it answers again (`ready`, probed one call
at a time). The survivor stays the decider after the other is back: a restarted actor starts with
an empty prefix index and in-flight ledgers, so it only follows the events (and warms up) until the
decider itself is gone. Every replica switches on the same evidence (the decider failing), so they
agree on the decider without talking to each other."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from actors.protocol import ProfileEvent
from serve_app.gateway.batcher import ActorBatcher

log = logging.getLogger("ray_epp.gateway.failover")

FAILOVERS = "ray_epp_profile_actor_failovers_total"
MIRROR_DELAY_S = 0.02  # events for the standby leave in batches at most this far apart
PROBE_EVERY_S = 0.5  # a gone actor is asked again this often while its calls fail at once


class Link(Protocol):
    handle: Any

    async def run_batch(self, items: list, deadline: float | None = None, wait_for_restart: bool = True) -> list: ...


def actor_gone(err: BaseException) -> bool:
    """Whether a failed batch failed for its actor (dead, restarting, unreachable, silent), not
    for an item in it."""
    from ray.exceptions import ActorUnavailableError, RayActorError

    gone = ActorUnavailableError | RayActorError | ConnectionError | TimeoutError | asyncio.CancelledError
    return isinstance(err, gone)


class FailoverLink:
    def __init__(
        self,
        primary: Link,
        standby: Link,
        call_timeout_s: float = 10.0,
        failover_after_s: float = 0.5,
        recorder: Any = None,
        labels: tuple[str, str] = ("", ""),
    ) -> None:
        self.links = (primary, standby)
        self.call_timeout_s = call_timeout_s
        self.failover_after_s = failover_after_s
        self.up = [True, True]
        self.decider = 0  # the primary until it is gone; then the survivor, until that one is gone
        self.failovers = 0
        self._recorder = recorder
        self._labels = labels
        self._mirrors = tuple(
            ActorBatcher(
                lambda items, i=i: self._mirror(i, items),
                max_in_flight=1,  # in order
                notify_delay_s=MIRROR_DELAY_S,
                split_on=lambda err: not actor_gone(err),
            )
            for i in range(2)
        )
        self._probes: list[asyncio.Task | None] = [None, None]

    @property
    def active(self) -> int:
        """The decider while it answers, else the other one while that one does."""
        return self.decider if self.up[self.decider] or not self.up[1 - self.decider] else 1 - self.decider

    async def run_batch(self, items: list) -> list:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.call_timeout_s
        first = self.decider = self.active
        other = 1 - first
        if not self.up[other]:  # no survivor to turn to: a lone actor, waited for within the budget
            return await self.links[first].run_batch(items, deadline)
        for item in items:
            if isinstance(item, ProfileEvent):
                self._mirrors[other].notify(item)
        try:
            attempt = min(deadline, loop.time() + self.failover_after_s)
            return await self.links[first].run_batch(items, attempt, wait_for_restart=False)
        except Exception as err:
            if not actor_gone(err):
                raise
            self._gone(first, err)
        self.decider = other
        self.failovers += 1
        if self._recorder is not None:
            self._recorder.inc(FAILOVERS, self._labels)
        # Once, on the survivor, within what is left of the budget: the calls only.
        calls = [i for i, item in enumerate(items) if not isinstance(item, ProfileEvent)]
        out: list = [None] * len(items)
        if calls:
            answers = await self.links[other].run_batch([items[i] for i in calls], deadline)
            for i, answer in zip(calls, answers, strict=True):
                out[i] = answer
        return out

    async def _mirror(self, i: int, items: list) -> list:
        if not self.up[i]:
            return [None] * len(items)  # gone: it starts again from the events after its return
        deadline = asyncio.get_running_loop().time() + self.call_timeout_s
        try:
            return await self.links[i].run_batch(items, deadline, wait_for_restart=False)
        except Exception as err:
            if actor_gone(err):
                self._gone(i, err)
            raise

    def _gone(self, i: int, err: BaseException) -> None:
        if not self.up[i]:
            return
        self.up[i] = False
        role = ("primary", "standby")[i]
        log.warning(
            "profile %s shard %s: the %s actor is gone (%s); left out until it answers", *self._labels, role, err
        )
        if self._probes[i] is None:
            self._probes[i] = asyncio.get_running_loop().create_task(self._probe(i))

    async def _probe(self, i: int) -> None:
        """One `ready` call at a time until the actor answers with a snapshot: a restarting actor
        holds the call until it runs again, a dead address fails it at once (then wait a little)."""
        try:
            while True:
                try:
                    await self.links[i].handle.ready.remote(1)
                except Exception:
                    await asyncio.sleep(PROBE_EVERY_S)
                else:
                    self.up[i] = True
                    log.warning("profile %s shard %s: %s actor is back", *self._labels, ("primary", "standby")[i])
                    return
        finally:
            self._probes[i] = None
