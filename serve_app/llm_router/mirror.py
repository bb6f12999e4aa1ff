"""A Serve request router's local mirror of its profile actors: the same profiles (the same
plugins, built from the same config) run in the router's process, so `choose_replicas` decides
without an actor call.

The shared state still lives in the profile actors. The mirror applies its router's decisions
(PreRequest), first tokens (ResponseFirstToken, inferred: serve_app/llm_router/first_token.py) and
completions (ResponseComplete) at once, and queues them; every `sync_interval_s` one call per
profile actor (`ProfileActor.sync`) sends the queue and brings back the events the other routers
sent since the last call (actors/event_log.py), which the mirror applies too. So every
router's mirror converges on the same prefix index, in-flight ledgers and LoRA residency, a few
milliseconds behind the others' decisions. A router that starts late, or finds the actor restarted
(a new epoch), rebuilds its profile and replays what the actor's log holds.

Nothing waits on the actors on the decision path: the sync runs as a task on the router's loop,
one call in flight per actor, its queue bounded (the oldest events dropped, counted), and an
unreachable actor costs only staleness (the mirror keeps deciding; `sync_errors` counts)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from actors.event_log import LogPage
from actors.protocol import ProfileEvent
from scheduler import (
    CycleState,
    Endpoint,
    EndpointPickerConfig,
    LLMRequest,
    ProfileRunResult,
    SchedulingResult,
)
from scheduler.config import Placement, build_for
from scheduler.lifecycle import Lifecycle, LifecycleEvent
from scheduler.scheduler import run_profile
from scheduler.trace import SchedulingTrace

log = logging.getLogger("ray_epp.serve.llm_mirror")

MAX_QUEUED = 5_000  # events awaiting a sync per profile (an unreachable actor: the oldest go)
LAG_SAMPLES = 10_000  # followed events' delays kept, for the percentiles


@dataclass(slots=True)
class MirrorCounters:
    syncs: int = 0  # sync round trips that answered
    sync_errors: int = 0  # that failed (actor restarting, gone, slow)
    resets: int = 0  # mirror rebuilt from the actor's log (first sync, restart, fell behind)
    sent: int = 0  # own events delivered to the actors
    followed: int = 0  # other routers' events applied
    dropped: int = 0  # own events dropped from a full queue
    lag_s: deque[float] = field(default_factory=lambda: deque(maxlen=LAG_SAMPLES))

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("syncs", "sync_errors", "resets", "sent", "followed", "dropped")}


@dataclass(slots=True)
class _Follower:
    """One profile: its local instance and where it stands in its actor's log."""

    name: str
    profile: Any
    hooks: Lifecycle
    actor: Any = None
    epoch: str | None = None
    cursor: int = 0
    queue: deque[ProfileEvent] = field(default_factory=lambda: deque(maxlen=MAX_QUEUED))


class RouterMirror:
    """A ProfileRunner over the profiles in this process, following the profile actors."""

    concurrent = False  # in-process: the profiles of a round run one after another

    def __init__(
        self,
        cfg: EndpointPickerConfig,
        origin: str,
        sync_interval_s: float = 0.005,
        sync_timeout_s: float = 2.0,
    ) -> None:
        self._cfg = cfg
        self.origin = origin  # this router's name in the actors' logs
        self.sync_interval_s = sync_interval_s
        self.sync_timeout_s = sync_timeout_s
        self.body_fields: frozenset[str] = frozenset()  # what of a body the actors get (the config's)
        self.followers = {p.name: self._build(p.name) for p in cfg.scheduling_profiles}
        self.counters = MirrorCounters()
        self._task: asyncio.Task | None = None

    def _build(self, name: str, old: _Follower | None = None) -> _Follower:
        # One profile per build, as its actor does (the same placement): plugins the profiles share
        # in a config are one instance per profile there, so each learns each event once here too.
        placed = build_for(self._cfg, Placement.PROFILE_ACTOR, profile=name)
        self.body_fields = placed.built.body_fields
        follower = _Follower(name, placed.profile, placed.lifecycle)
        if old is not None:
            follower.actor, follower.queue = old.actor, old.queue
        return follower

    # --- deciding (the ProfileRunner) ------------------------------------------------------------

    async def __call__(
        self,
        names: list[str],
        request: LLMRequest,
        cycle_state: CycleState,
        endpoints: list[Endpoint] | None,
        trace: SchedulingTrace | None,
    ) -> dict[str, ProfileRunResult | None]:
        return {n: run_profile(self.followers[n].profile, request, cycle_state, endpoints or [], trace) for n in names}

    # --- learning: at once here, then in the actors ------------------------------------------------

    def pre_request(self, request: LLMRequest, result: SchedulingResult) -> None:
        kind = LifecycleEvent.PRE_REQUEST
        event = ProfileEvent.of(kind, request, result, at=time.time(), body_fields=self.body_fields)
        self._learn(request, event)

    def first_token(self, request: LLMRequest, endpoint_name: str) -> None:
        self._learn(request, ProfileEvent.of(LifecycleEvent.FIRST_TOKEN, request, None, endpoint_name, time.time()))

    def response_complete(self, request: LLMRequest, endpoint_name: str) -> None:
        event = ProfileEvent.of(LifecycleEvent.RESPONSE_COMPLETE, request, None, endpoint_name, time.time())
        self._learn(request, event)

    def _learn(self, request: LLMRequest, event: ProfileEvent) -> None:
        """`request` (what this router scored, its derived data included) teaches the first profile; the
        queued event carries a fresh copy: a plugin marks in a request's derived data that it learned it,
        and the actors and the other routers must learn it too."""
        for i, follower in enumerate(self.followers.values()):
            _apply(follower.hooks, event, request if i == 0 else None)
            if len(follower.queue) == follower.queue.maxlen:
                self.counters.dropped += 1
            follower.queue.append(event)

    # --- following the actors ------------------------------------------------------------------

    async def attach(self, actors: dict[str, Any], timeout_s: float) -> None:
        """Take the actors' state (their logs, from the start kept), then follow them in a task."""
        for name, follower in self.followers.items():
            follower.actor = actors[name]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            try:
                if await self.sync_once(raise_errors=True):
                    break
            except Exception:
                # An actor still starting, or slow on a loaded machine, misses one round's timeout:
                # try again until the caller's bound, then let the error out.
                if loop.time() + 0.1 >= deadline:
                    raise
                await asyncio.sleep(0.1)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._follow())

    async def _follow(self) -> None:
        while True:
            await asyncio.sleep(self.sync_interval_s)
            try:
                await self.sync_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # never let the follower die: the next round tries again
                log.exception("EPPRequestRouter: mirror sync failed")

    async def sync_once(self, raise_errors: bool = False) -> bool:
        """One round trip per actor; True when every actor had nothing more to give."""
        done = await asyncio.gather(*(self._sync(f, raise_errors) for f in list(self.followers.values())))
        return all(done)

    async def _sync(self, follower: _Follower, raise_errors: bool) -> bool:
        batch = list(follower.queue)
        follower.queue.clear()
        try:
            async with asyncio.timeout(self.sync_timeout_s):
                page: LogPage = await follower.actor.sync.remote(self.origin, batch, follower.epoch, follower.cursor)
        except Exception:
            self.counters.sync_errors += 1
            room = follower.queue.maxlen - len(follower.queue)  # type: ignore[operator]
            self.counters.dropped += max(0, len(batch) - room)
            follower.queue.extendleft(reversed(batch[-room:] if room else []))  # sent again next round
            if raise_errors:
                raise
            return False
        self.counters.syncs += 1
        self.counters.sent += len(batch)
        if page.reset:  # first sync, actor restarted, or this router fell out of the log's window
            self.counters.resets += 1
            follower = self.followers[follower.name] = self._build(follower.name, follower)
            log.info("EPPRequestRouter: profile %s mirror rebuilt from epoch %s", follower.name, page.epoch)
        now = time.time()
        for event in page.events:
            _apply(follower.hooks, event)  # a copy: the actor's own learning marked the data of the one it sent
            if event.at and not page.reset:
                self.counters.lag_s.append(now - event.at)
        if page.reset:  # what this router learned while the page was on its way: not in the log yet
            for event in follower.queue:
                _apply(follower.hooks, event)
        self.counters.followed += len(page.events)
        follower.epoch, follower.cursor = page.epoch, page.cursor
        return not page.more

    async def close(self) -> None:
        """Stop following, after a last sync (the queued events reach the actors)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        with contextlib.suppress(Exception):
            await self.sync_once()


def _apply(hooks: Lifecycle, event: ProfileEvent, request: LLMRequest | None = None) -> None:
    """An event on a mirror's plugins (what ProfileActor._apply does with it); on `request`, else on
    a copy of the event's (one per profile, as each actor has its own: the derived data marks what a
    plugin learned, and a plugin of the same name in another profile must learn it as well)."""
    if request is None:
        request = event.request.with_body_fields(event.request.body)  # all it carries, and a memo of its own
    hooks.deliver(event.kind, request, event.result, event.endpoint_name)
