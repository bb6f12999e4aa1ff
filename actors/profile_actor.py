"""One actor per scheduling profile: it owns the profile's plugin instances and their state (e.g. a
prefix-cache index), keeps a local endpoint snapshot fresh by long-polling the datastore, and runs
one scheduling cycle per call, in batches (the gateway coalesces concurrent requests).

Because each profile lives in its own process, the profiles a handler picks in one round run at
the same time. A restarted profile actor (max_restarts=-1) rebuilds its plugins from the config it
was constructed with; learned plugin state (the prefix index) starts empty again."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib
import json
import logging
import os
import time
from collections import deque
from typing import Any

import ray
from ray.exceptions import ActorDiedError

from actors.channel import ChannelServer
from actors.event_log import EventLog, LogPage
from actors.kv_event_feeds import KVEventFeeds
from actors.metrics_hub import MetricsPusher, MetricsRecorder, get_or_create_hub
from actors.options import as_options
from actors.pool_feed import PoolFeed
from actors.protocol import ProfileCall, ProfileEvent, ProfileOutcome, as_served
from actors.snapshot_delta import PoolCopy
from actors.tentative_decisions import TentativeDecisions
from scheduler import (
    Endpoint,
    ErrorCode,
    SchedulingError,
    dump_config,
    load_config,
    run_profile,
)
from scheduler.config import Placement, build_for
from scheduler.cycle_state import profile_error_key
from scheduler.interfaces import KVEventSink, bind_plugin_metrics
from scheduler.lifecycle import Lifecycle, LifecycleEvent
from scheduler.plugins.support.inflight_ledger import InFlightLedger
from scheduler.plugins.support.prefix.index import PrefixIndex
from scheduler.trace import SchedulingTrace

log = logging.getLogger("ray_epp.actors.profile")

NO_ENDPOINTS = "no ready endpoints in the pool"
# The lifecycle events a gateway or a Serve router sends a profile actor (counted in `info`).
CROSSING = (
    LifecycleEvent.PRE_REQUEST, LifecycleEvent.FIRST_TOKEN, LifecycleEvent.RESPONSE_COMPLETE, LifecycleEvent.WITHDRAW,
)  # fmt: skip
# A restarted actor answers its first calls once it has a snapshot (or after this long, empty).
FIRST_SNAPSHOT_WAIT_S = 5.0


def config_digest(config: dict[str, Any]) -> str:
    """A stable digest of a dumped EndpointPickerConfig (to tell whether an actor runs this config)."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


@ray.remote
class ProfileActor:
    def __init__(
        self,
        config: dict[str, Any],
        profile_name: str,
        datastore_name: str | None,
        namespace: str | None = None,
        options: dict[str, Any] | None = None,
    ) -> None:
        self._options = as_options(options)
        for module in self._options.plugin_modules:
            importlib.import_module(module)
        cfg = load_config(config)
        placed = build_for(cfg, Placement.PROFILE_ACTOR, profile=profile_name)
        built = placed.built
        self._name = profile_name
        self._digest = config_digest(dump_config(cfg))
        self.profile = placed.profile
        # The plugins placed in this profile's actor hear its events: the same dispatcher, and so
        # the same rule, as the in-process Scheduler's and the gateway's (scheduler/lifecycle.py).
        self._hooks = placed.lifecycle
        # Each call's decision counts in the ledgers at once, until the gateway's PreRequest for it.
        self._tentative = TentativeDecisions(self._hooks, profile_name)
        # Plugins that consume KV events (the precise prefix producer): this actor subscribes to its
        # pods' event streams and feeds them (actors/kv_event_feeds.py).
        self._kv = Lifecycle(built.at(Placement.PROFILE_ACTOR))
        sinks = self._kv.having(KVEventSink)
        self._kv_sinks = sinks
        self._kv_feeds = KVEventFeeds(sinks) if sinks and datastore_name else None
        self._datastore_name = datastore_name
        self._namespace = namespace or ray.get_runtime_context().namespace
        self._datastore: Any = None
        self._version = 0
        self._endpoints: list[Endpoint] = []
        self._pool = PoolCopy()
        self._feed = PoolFeed()
        self._snapshot_event = asyncio.Event()
        self._intervals: deque[tuple[float, float]] = deque(maxlen=512)
        self._calls = 0
        self._watch_errors = 0
        self._events = {e.value: 0 for e in CROSSING}
        self._recorder = MetricsRecorder()
        self._pusher: MetricsPusher | None = None
        if self._options.push_plugin_metrics:  # plugins with families of their own (the prefix indexer)
            bind_plugin_metrics(built.plugins.values(), self._recorder)
        # Without a datastore (a Serve request router's actors) every call brings its endpoints.
        self._watcher = asyncio.get_running_loop().create_task(self._watch_loop()) if datastore_name else None
        self._kv_drainer = (
            asyncio.get_running_loop().create_task(self._kv_drain_loop()) if self._kv_feeds is not None else None
        )
        # The same run_batch, also served on 127.0.0.1 for same-node gateways (see actors/channel.py).
        self._channel = ChannelServer(self._run_batch_by_channel) if self._options.direct_channel else None
        self._batches = self._channel_batches = 0
        self._log = EventLog()  # what Serve request routers sent, for the others to follow (sync)
        self._channel_started = (
            asyncio.get_running_loop().create_task(self._channel.start()) if self._channel is not None else None
        )
        if self._kv_feeds is not None and self._options.push_plugin_metrics:
            feeds, name = self._kv_feeds, profile_name
            self._recorder.add_collector(lambda: feeds.metric_samples(name))
            self._start_pusher()  # the subscriptions show before the first request

    # --- the snapshot --------------------------------------------------------------------------

    async def _watch_loop(self) -> None:
        opts = self._options
        while True:
            try:
                if self._datastore is None:
                    self._datastore = ray.get_actor(self._datastore_name, namespace=self._namespace)
                    self._feed.datastore_changed()
                # Only what changed since the version held (actors/snapshot_delta.py), from this
                # node's snapshot relay when there is one (actors/pool_feed.py).
                packed = await self._feed.next(self._datastore, self._pool.version, opts.watch_timeout_s)
                delta = self._pool.apply(packed)
                if delta is not None:
                    as_served(delta.endpoints)
                    self._version, self._endpoints = self._pool.version, self._pool.endpoints
                    if self._kv_feeds is not None:
                        self._kv_feeds.sync(self._endpoints)
                    self._snapshot_event.set()
                    self._snapshot_event = asyncio.Event()
                    if opts.snapshot_min_interval_s:
                        await asyncio.sleep(opts.snapshot_min_interval_s)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # datastore restarting, gone, or not created yet: keep the last snapshot
                self._watch_errors += 1
                if isinstance(err, (ActorDiedError, ValueError)):
                    self._datastore = None  # look it up by name again (it may be re-created)
                log.debug("profile %s: watch failed: %s", self._name, err)
                await asyncio.sleep(0.1)

    async def _kv_drain_loop(self) -> None:
        assert self._kv_feeds is not None
        while True:
            await asyncio.sleep(self._options.kv_events_drain_s)
            try:
                self._kv_feeds.drain()
            except Exception:  # never let the feed die: the next round tries again
                log.exception("profile %s: delivering KV events failed", self._name)

    async def apply_kv_events(self, pod: str, batches: list[Any]) -> int:
        """Feed a pod's event batches (`kvevents.KVEventBatch`, oldest first) to this actor's
        KV-event sinks: for a feeder outside the actor. Returns how many sinks took them."""
        return self._kv.kv_events(pod, batches)

    async def set_kv_event_status(self, pod: str, status: str) -> int:
        return self._kv.kv_event_status(pod, status)

    async def kv_events(self) -> dict[str, Any]:
        """Each pod's KV-event stream (state, counters, addresses) and what the sinks hold."""
        return {
            "streams": self._kv_feeds.statuses() if self._kv_feeds is not None else {},
            "feed_errors": self._kv_feeds.errors if self._kv_feeds is not None else 0,
            "sinks": {s.name: s.info() for s in self._kv_sinks if callable(getattr(s, "info", None))},
        }

    async def ready(self, min_version: int = 1) -> int:
        """Wait until a snapshot of at least `min_version` arrived; returns the version held."""
        while self._version < min_version:
            await self._snapshot_event.wait()
        return self._version

    # --- scheduling ----------------------------------------------------------------------------

    async def run_batch(self, items: list[ProfileCall | ProfileEvent]) -> list[ProfileOutcome | None]:
        """Apply events and run the profile once per call, in order, all on the current snapshot;
        each call's decision is told to the ledgers before the next (actors/tentative_decisions.py)."""
        if self._version == 0 and self._watcher is not None:  # just (re)started: wait briefly for the first snapshot
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(FIRST_SNAPSHOT_WAIT_S):
                    await self.ready(1)
        started = time.time()
        version, endpoints = self._version, self._endpoints
        self._tentative.expire()
        out: list[ProfileOutcome | None] = []
        for item in items:
            if isinstance(item, ProfileCall):
                if item.endpoints is not None:
                    outcome = self._run_one(item, 0, item.endpoints)
                else:
                    outcome = self._run_one(item, version, endpoints)
                if self._options.tentative_decisions:
                    self._tentative.tell(item.request, outcome.result)
                out.append(outcome)
                self._calls += 1
            else:
                self._apply(item)
                out.append(None)
        self._intervals.append((started, time.time()))
        self._batches += 1
        self._start_pusher()
        return out

    async def sync(self, origin: str, events: list[ProfileEvent], epoch: str | None, cursor: int) -> LogPage:
        """A Serve request router's round trip (serve_app/llm_router/mirror.py): apply and log the events it
        sent (the decisions and completions it made on its local mirror), and return the other
        routers' events since its cursor, so its mirror follows the shared state."""
        for event in events:
            self._apply(event)
            self._log.append(origin, event)
        return self._log.page(origin, epoch, cursor)

    def _apply(self, event: ProfileEvent) -> None:
        self._events[event.kind] = self._events.get(event.kind, 0) + 1
        if event.kind == LifecycleEvent.WITHDRAW:  # only a decision this actor told its ledgers is taken back
            self._tentative.withdraw(event.request)
            return
        self._tentative.settle(event.request.request_id)  # the real event replaces a tentative entry
        self._hooks.deliver(event.kind, event.request, event.result, event.endpoint_name)

    def _start_pusher(self) -> None:
        """Plugin timings and the plugins' own families go to the metrics hub (once one exists),
        like the gateway's. One source per process: shards and restarts add up, none overwrites."""
        if self._pusher is None and self._options.push_plugin_metrics:
            with contextlib.suppress(Exception):
                self._pusher = MetricsPusher(
                    self._recorder, f"profile-{self._name}-{os.getpid()}", get_or_create_hub(self._namespace)
                )
                self._pusher.start()

    def _run_one(self, call: ProfileCall, version: int, endpoints: list[Endpoint]) -> ProfileOutcome:
        started = time.time()
        trace = SchedulingTrace() if call.want_trace else None
        result = None
        error: SchedulingError | None = None
        if not endpoints:
            error = SchedulingError(ErrorCode.SERVICE_UNAVAILABLE, NO_ENDPOINTS)
        else:
            try:
                result = run_profile(
                    self.profile, call.request, call.cycle_state, endpoints, trace, self._recorder.plugin_timer
                )
            except Exception as err:  # a plugin bug fails this call, not the batch
                log.exception("profile %s failed on request %s", self._name, call.request.request_id)
                message = f"profile {self._name!r} failed: {type(err).__name__}: {err}"
                error = SchedulingError(ErrorCode.INTERNAL, message)
            else:
                if result is None:
                    cause = call.cycle_state.read(profile_error_key(self._name))
                    error = (
                        cause
                        if isinstance(cause, SchedulingError)
                        else SchedulingError(ErrorCode.INTERNAL, f"profile {self._name!r} failed")
                    )
        profile_trace = None if trace is None else trace.profiles.get(self._name)
        outcome = ProfileOutcome(result, error, profile_trace, version, started, time.time())
        if call.traceparent is not None:  # a traced request: the run's span goes back with the answer
            outcome.span = {"traceparent": call.traceparent, "pid": os.getpid(), "endpoints": len(endpoints)}
        return outcome

    async def _run_batch_by_channel(self, items: list[ProfileCall | ProfileEvent]) -> list[ProfileOutcome | None]:
        self._channel_batches += 1
        return await self.run_batch(items)

    async def channel_endpoint(self) -> dict[str, Any] | None:
        """Where a gateway replica on this node can send run_batch directly, or None."""
        if self._channel is None or self._channel_started is None:
            return None
        await self._channel_started
        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "port": self._channel.port,
            "token": self._channel.token,
        }

    async def run_intervals(self) -> list[tuple[float, float]]:
        """(started, finished) wall-clock times of recent run_batch calls."""
        return list(self._intervals)

    async def info(self) -> dict[str, Any]:
        return {
            "profile": self._name,
            "pid": os.getpid(),
            "config_digest": self._digest,
            "version": self._version,
            "endpoints": [e.name for e in self._endpoints],
            "plugins": [p.name for p in self.profile.plugins()],
            "calls": self._calls,
            # batches that came over the same-node channel; the others were Ray calls (other nodes)
            "batches": {"channel": self._channel_batches, "ray": self._batches - self._channel_batches},
            "hook_errors": self._hooks.errors,
            "watch_errors": self._watch_errors,
            "events": dict(self._events),
            # decisions told to the ledgers at once; withdrawn: never sent; expired: never heard of again
            "tentative": self._tentative.counts(),
            "event_log": {"epoch": self._log.epoch, "seq": self._log.seq, "kept": len(self._log)},
            "state_sizes": state_sizes(self.profile.plugins()),
            "kv_events": (
                {pod: st["state"] for pod, st in self._kv_feeds.statuses().items()} if self._kv_feeds else {}
            ),
        }

    def __repr__(self) -> str:  # shows in Ray's logs and errors
        with contextlib.suppress(Exception):
            return f"ProfileActor({self._name})"
        return "ProfileActor"


def state_sizes(plugins: list[Any]) -> dict[str, int]:
    """Entries in the structures that grow with traffic (prefix indexes, in-flight ledgers), per
    plugin, looking one plugin deep (a scorer's own producer): what bench/soak.py watches stay
    bounded. `"<plugin>.<attribute>": entries`."""
    sizes: dict[str, int] = {}
    seen: set[int] = set()

    def walk(label: str, obj: Any, depth: int) -> None:
        for attr in ("index", "precise", "blocks", "ledger", "producer"):
            value = getattr(obj, attr, None)
            if value is None or id(value) in seen:
                continue
            seen.add(id(value))
            if isinstance(value, PrefixIndex | InFlightLedger):
                sizes[f"{label}.{attr}"] = len(value)
            elif depth > 0:
                walk(f"{label}.{attr}", value, depth - 1)

    for plugin in plugins:
        walk(getattr(plugin, "name", type(plugin).__name__), plugin, 1)
    return sizes
