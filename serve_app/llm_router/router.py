"""`EPPRequestRouter`: Ray EPP's scheduler as a Ray Serve request router, for Ray Serve LLM
deployments (or any deployment whose methods take an OpenAI-shaped request).

Serve gives every deployment handle a request router; this one runs a GIE EndpointPickerConfig
over the deployment's replicas. Each `RunningReplica` is an endpoint: named by its replica id,
labelled from its metadata, node and zone, with the metrics its `record_routing_stats` publishes
(serve_app/llm_router/stats.py), or Serve's queue-length cache when it publishes none, and its
multiplexed model ids as resident LoRA adapters (serve_app/llm_router/endpoints.py). `choose_replicas`
returns the scheduler's targets best first, then the other replicas: Serve still sends to the
first that accepts, so `max_ongoing_requests` back-pressure holds.

Scheduling state is not per router: it lives in profile actors found by name (one set per
config, `actors/launcher.start_router_profile_actors`), so every router of every ingress replica
shares one prefix index, in-flight ledger and LoRA residency. The router decides on a local mirror
of those profiles (serve_app/llm_router/mirror.py): no actor call per request. A decision is GIE's
PreRequest as soon as it is made (Serve reports it routed a replica round trip later; the ones
in between must see it), corrected if Serve sent the request elsewhere; `on_request_completed` is
ResponseComplete, and first tokens, which Serve does not report, are inferred from the replicas'
published engine queues (serve_app/llm_router/first_token.py). All apply to the mirror at once and go to
the actors in batches every few milliseconds; the same round trip brings back the other routers'
events from the actor's log, so the mirrors converge. Counters: serve_app/llm_router/router_stats.py.

Nothing here blocks the event loop: actor lookup runs in a thread, calls are awaited. When the
scheduler can not decide (no endpoint, a profile error, actors not up), the request gets Serve's
own choice (power of two choices, with Serve's locality and multiplexing preferences) and the
fallback is counted (`router_stats()`); a request is never lost to the router.

Use it as Serve users do:

    RequestRouterConfig(request_router_class="serve_app.llm_router:EPPRequestRouter",
                        request_router_kwargs={"config": "ray_epp/configs/default.yaml"})
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
import uuid
from collections import OrderedDict
from typing import Any

import ray
from ray.serve._private.request_router.pow_2_router import PowerOfTwoChoicesRequestRouter
from ray.serve.request_router import (
    LocalityMixin,
    MultiplexMixin,
    PendingRequest,
    ReplicaID,
    RequestRouter,
    RunningReplica,
)

from actors.launcher import start_router_profile_actors
from actors.options import ActorOptions
from scheduler import (
    Endpoint,
    LLMRequest,
    ProfileRunResult,
    SchedulingResult,
    schedule_cycles,
)
from scheduler.config import Placement, build_for
from scheduler.trace import SchedulingTrace
from serve_app.llm_router.endpoints import ReplicaEndpoints
from serve_app.llm_router.first_token import FirstTokenInference
from serve_app.llm_router.mirror import RouterMirror
from serve_app.llm_router.requests import request_of
from serve_app.llm_router.router_config import (
    RouterConfigError,
    check_router_config,
    read_config,
    scrape_options,
)
from serve_app.llm_router.router_stats import (  # the stats' public names, here too
    RoutedRequest,
    RouterCounters,
    percentiles_ms,
    recent_decisions,
    register,
    router_stats,
    routers,
)
from serve_app.llm_router.scrapers import ReplicaScrapers
from serve_app.llm_router.stats import published_queue
from serve_app.llm_router.tracing import ChooseSpan, router_tracing

log = logging.getLogger("ray_epp.serve.llm_router")

# Where the routers' profile actors live, whatever namespace a router runs in (Serve's replicas run
# in "serve", a driver in its own): routers must find the same actors.
ROUTER_NAMESPACE = "ray-epp-router"
MAX_REMEMBERED = 20_000  # decisions kept for on_request_routed / completions not yet seen


class NoDecision(Exception):
    """The scheduler gave no usable target; `reason` is the fallback counter's key."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


class EPPRequestRouter(LocalityMixin, MultiplexMixin, RequestRouter):
    """Serve request router running a GIE EndpointPickerConfig over the deployment's replicas.

    No FIFOMixin: a replica chosen for one request goes to that request (FIFOMixin may hand it to
    an older one, whose decision named another replica)."""

    def initialize_state(
        self,
        config: str | dict[str, Any] | None = None,
        namespace: str = ROUTER_NAMESPACE,
        actor_options: dict[str, Any] | None = None,
        sync_interval_s: float = 0.005,
        startup_wait_s: float = 30.0,
        retry_startup_s: float = 5.0,
        scrape_metrics: bool = True,
        scrape: dict[str, Any] | None = None,
        learn_on_decision: bool = True,
        infer_first_token: bool = True,
        trace_decisions: int = 0,
        tracing: dict[str, Any] | None = None,
        **_: Any,
    ) -> None:
        """Called by Serve with `request_router_kwargs`. `config`: a path or YAML text (None: Ray
        EPP's default); `actor_options`: `ActorOptions` fields for the profile actors (e.g.
        `plugin_modules` for custom plugins). `sync_interval_s`: how often the local mirror sends
        its events to the profile actors and takes the other routers'. `scrape_metrics`: scrape the
        engine's Prometheus page of replicas that have an HTTP endpoint (Serve's direct ingress, or `epp.metrics_url` in
        their metadata) with the engine presets, as the gateway's metrics actors do; `scrape`:
        `ActorOptions` scrape fields (`refresh_interval_s`, `scrape_timeout_s`, `metrics_path`).
        `learn_on_decision`: the mirror learns a decision (PreRequest) when it is made, as GIE's
        director runs PreRequest right after the pick; False: when Serve reports it routed, a
        replica round trip later, so the decisions in between do not see it. `infer_first_token`:
        tell the ledger of first tokens inferred from the replicas' published engine queues
        (serve_app/llm_router/first_token.py); False: a request's prompt counts until it completes.
        `trace_decisions`: keep the scheduling traces (each scorer's scores, the picks) of the last
        this many decisions in `decision_traces`, by internal request id, to see why a request
        went where it went (costs a little per decision; 0: none). `tracing`: OpenTelemetry spans
        of `choose_replicas` (serve_app/llm_router/tracing.py; None: off)."""
        self._cfg = read_config(config)
        # What it can not run is refused here, never run as something else. Serve builds the router
        # inside its long-poll callback, where an exception leaves every request waiting for a
        # router that never comes: so the refusal is kept, logged, and fails each request instead.
        self.refused: RouterConfigError | None = None
        self.tracing = None
        try:
            check_router_config(self._cfg)
            scraping = scrape_options(self._cfg, scrape, scrape_metrics)
            self.tracing = router_tracing(tracing)
        except RouterConfigError as err:
            self.refused, scraping, scrape_metrics = err, ActorOptions(), False
            log.error("EPPRequestRouter for %s refuses its config; every request fails: %s", self._deployment_id, err)
        built = build_for(self._cfg, Placement.ROUTER).built
        self._handler, self._body_fields = built.handler, built.body_fields
        self.mirror = RouterMirror(self._cfg, f"router-{uuid.uuid4().hex[:12]}", sync_interval_s)
        self._profiles = {p.name: p.name for p in self._cfg.scheduling_profiles}
        self._first_profile = self._cfg.scheduling_profiles[0].name
        self._namespace = namespace
        self._actor_options = {"push_plugin_metrics": False, "profile_num_cpus": 0.0, **(actor_options or {})}
        self._startup_wait_s = startup_wait_s
        self._retry_startup_s = retry_startup_s
        self._attached = False
        self._starting: asyncio.Future | None = None
        self._retry_at = 0.0
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="epp-router")
        # internal request id -> (request, result, when decided) awaiting on_request_routed;
        # then -> (request, replica)
        self._decisions: OrderedDict[str, tuple[LLMRequest, SchedulingResult | None, float]] = OrderedDict()
        self._routed: OrderedDict[str, tuple[LLMRequest, str]] = OrderedDict()
        self._scrape = scrape_metrics
        self._learn_on_decision = learn_on_decision
        self._first_tokens = FirstTokenInference() if infer_first_token else None
        self._scrapers = ReplicaScrapers(scraping)
        self._endpoints = ReplicaEndpoints(self._scrapers, self.replica_queue_len_cache.get)
        self.counters = RouterCounters()
        self.decision_traces: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._trace_decisions = trace_decisions
        register(self)

    # --- the profile actors ----------------------------------------------------------------------

    def _start_actors(self) -> dict[str, Any]:
        """In a thread: find or create the actors, then wait until each answers."""
        actors = start_router_profile_actors(self._cfg, namespace=self._namespace, options=self._actor_options)
        ray.get([a.info.remote() for a in actors.values()], timeout=self._startup_wait_s)
        return actors

    async def _attach(self) -> None:
        """Find or start the actors, then take their state into the mirror (their logs)."""
        loop = asyncio.get_running_loop()
        actors = await loop.run_in_executor(self._executor, self._start_actors)
        await self.mirror.attach(actors, self._startup_wait_s)
        log.info("EPPRequestRouter: following profile actors %s", sorted(actors))

    async def _ensure_mirror(self) -> RouterMirror:
        """The mirror, once it holds the shared state (the first requests wait for that)."""
        if self._attached:
            return self.mirror
        loop = asyncio.get_running_loop()
        if self._starting is None:
            if loop.time() < self._retry_at:
                raise NoDecision("actors_unavailable", "profile actors failed to start; retrying later")
            self._starting = loop.create_task(self._attach())
        starting = self._starting
        try:
            await asyncio.shield(starting)
        except Exception as err:
            if self._starting is starting:
                self._starting = None
                self._retry_at = loop.time() + self._retry_startup_s
            raise NoDecision("actors_unavailable", f"{type(err).__name__}: {err}") from None
        self._attached = True
        return self.mirror

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        if hasattr(self, "_endpoints"):  # forget replicas that went away
            self._endpoints.keep({r.replica_id for r in replicas})
        if getattr(self, "_scrapers", None):  # stop those of replicas that went away (all: app deleted)
            self._on_loop(self._sync_scrapers)
        if getattr(self, "_first_tokens", None) is not None:  # new routing stats: whose first token came
            self._on_loop(self._published, replicas)
        if not replicas and getattr(self, "_attached", False):  # deleted (or scaled to zero): stop following
            self._on_loop(self._detach)

    def _published(self, replicas: list[RunningReplica]) -> None:
        """First tokens inferred from the replicas' published engine queues reach the ledger."""
        assert self._first_tokens is not None
        self._first_tokens.forget({r.replica_id.unique_id for r in replicas})
        for replica in replicas:
            queue = published_queue(replica.routing_stats)
            if queue is None:
                continue
            name = replica.replica_id.unique_id
            for request in self._first_tokens.published(name, *queue):
                self.counters.first_tokens_inferred += 1
                self.mirror.first_token(request, name)

    def _detach(self) -> None:
        """Stop following and let go of the mirror's state (its prefix index, ledgers): a router
        stays alive as long as its handle, which Serve caches per deployment, and every object it
        holds is walked by each full collection of the process's garbage collector (the pauses
        grew with each dead router kept). The next request attaches a fresh mirror, rebuilt from
        the actors' logs as a late router's is; the counters carry over."""
        self._attached = False
        self._starting = None
        old = self.mirror
        self.mirror = RouterMirror(self._cfg, f"router-{uuid.uuid4().hex[:12]}", old.sync_interval_s)
        self.mirror.counters = old.counters
        self._decisions.clear()
        self._routed.clear()
        if self._first_tokens is not None:
            self._first_tokens = FirstTokenInference()
        self._event_loop.create_task(old.close())  # a last sync sends what it still queued

    def _sync_scrapers(self) -> None:
        """Scrape the current replicas that publish no engine state (on the router's loop)."""
        self._scrapers.sync({rid.unique_id: r for rid, r in self.curr_replicas.items()
                             if self._endpoints.converted(r).endpoint is None})  # fmt: skip

    # --- endpoints from replicas -----------------------------------------------------------------

    def endpoint_of(self, replica: RunningReplica) -> Endpoint:
        """The replica as the scheduler's endpoint (serve_app/llm_router/endpoints.py)."""
        return self._endpoints.endpoint_of(replica)

    # --- choosing --------------------------------------------------------------------------------

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        if pending_request is None or not candidate_replicas:
            return [candidate_replicas] if candidate_replicas else []
        if self.refused is not None:  # the caller gets the refusal (Serve stops routing a done request)
            if not pending_request.future.done():
                pending_request.future.set_exception(self.refused)
            self.counters.refused += 1
            return [candidate_replicas]
        started = time.perf_counter()
        span = ChooseSpan.begin(self.tracing, pending_request, candidate_replicas, self._deployment_id.name)
        try:
            ranked = await self._schedule(candidate_replicas, pending_request)
            if span is not None:
                span.chose(ranked, self._decisions.get(pending_request.metadata.internal_request_id))
        except Exception as err:
            reason = err.reason if isinstance(err, NoDecision) else "error"
            if span is not None:
                span.fell_back(reason, str(err))
            self.counters.fallbacks[reason] += 1
            log.debug("EPPRequestRouter: falling back to power of two choices (%s)", err)
            try:
                self._remember(pending_request, None)
            except Exception:  # an odd request: the fallback still routes it
                log.debug("EPPRequestRouter: could not read request for its hooks", exc_info=True)
            return await PowerOfTwoChoicesRequestRouter.choose_replicas(self, candidate_replicas, pending_request)
        finally:
            elapsed = time.perf_counter() - started
            self.counters.schedule_s += elapsed
            self.counters.choose_s.append(elapsed)
            if span is not None:
                span.end()
        self.counters.scheduled += 1
        # Serve tries the ranks in order and sends to the first replica that accepts; when every
        # replica is full it backs off and asks again (the scheduler then sees fresher state).
        pending_request.routing_context.should_backoff = True
        return ranked

    async def _schedule(
        self, candidates: list[RunningReplica], pending_request: PendingRequest
    ) -> list[list[RunningReplica]]:
        if self._scrape and self._endpoints.changed:  # scrapers follow the replica infos, not requests
            self._sync_scrapers()
            self._endpoints.changed = False
        mirror = await self._ensure_mirror()
        # An earlier decision (of the last second: not a lost one) not yet routed: unseen by the mirror.
        if self._decisions and next(reversed(self._decisions.values()))[2] > time.perf_counter() - 1.0:
            self.counters.decided_unseen += 1
        endpoints = [self.endpoint_of(r) for r in candidates]
        by_name = {r.replica_id.unique_id: r for r in candidates}
        request = self._request_of(pending_request)
        trace = SchedulingTrace() if self._trace_decisions else None
        try:
            result = await schedule_cycles(self._handler, self._profiles, mirror, request, endpoints, trace=trace)
        except Exception as err:  # SchedulingError (no endpoint, profile failed) or a plugin bug
            code = getattr(getattr(err, "code", None), "value", type(err).__name__)
            raise NoDecision(f"scheduling_{code}", str(err)) from None
        primary = result.profile_results.get(result.primary_profile_name)
        targets = [by_name[e.name] for e in (primary.target_endpoints if primary else []) if e.name in by_name]
        if not targets:
            raise NoDecision("no_target", f"primary profile {result.primary_profile_name!r} chose no replica")
        self._remember(pending_request, (request, result))
        if trace is not None:
            self._keep_trace(pending_request.metadata.internal_request_id, trace)
        if self._learn_on_decision:
            mirror.pre_request(request, result)
        chosen = {t.replica_id for t in targets}
        rest = [r for r in candidates if r.replica_id not in chosen]
        return [[t] for t in targets] + ([rest] if rest else [])

    def _keep_trace(self, iid: str, trace: SchedulingTrace) -> None:
        self.decision_traces[iid] = trace.to_json() | {"at": time.time()}
        while len(self.decision_traces) > self._trace_decisions:
            self.decision_traces.popitem(last=False)

    def _request_of(self, pending_request: PendingRequest) -> LLMRequest:
        return request_of(pending_request, self._deployment_id.name, self._body_fields)

    def _remember(self, pending_request: PendingRequest, decision: tuple[LLMRequest, SchedulingResult] | None) -> None:
        iid = pending_request.metadata.internal_request_id
        if decision is None:
            decision = (self._request_of(pending_request), None)
        self._decisions[iid] = (*decision, time.perf_counter())
        self._decisions.move_to_end(iid)
        while len(self._decisions) > MAX_REMEMBERED:
            self._decisions.popitem(last=False)

    # --- PreRequest and ResponseComplete --------------------------------------------------------

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        self._on_loop(self._routed_event, pending_request, replica_id.unique_id)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        self._on_loop(self._completed_event, internal_request_id, replica_id.unique_id)

    def _on_loop(self, fn: Any, *args: Any) -> None:
        """Run `fn` on the router's loop (the batchers live there), whichever thread Serve calls from."""
        loop = self._event_loop
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            fn(*args)
        else:
            loop.call_soon_threadsafe(fn, *args)

    def _routed_event(self, pending_request: PendingRequest, replica_name: str) -> None:
        iid = pending_request.metadata.internal_request_id
        decision = self._decisions.pop(iid, None)
        if decision is not None:
            request, result, decided_at = decision
            self.counters.routed_after_s.append(time.perf_counter() - decided_at)
        else:
            request, result = self._request_of(pending_request), None
        self.counters.routed += 1
        first = result.primary.target_endpoints[0].name if result is not None else None
        how = "fallback" if result is None else "scheduled" if first == replica_name else "moved"
        learned = result is not None and self._learn_on_decision  # the mirror has the decision already
        if how != "scheduled":
            if result is not None:
                self.counters.routed_not_first += 1
            result = self._result_for(result, replica_name)
        self.counters.recent.append(RoutedRequest(iid, request.target_model, replica_name, how, time.time()))
        self._routed[iid] = (request.without_body(), replica_name)
        if self._first_tokens is not None:
            self._first_tokens.routed(replica_name, self._routed[iid][0], time.time())
        while len(self._routed) > MAX_REMEMBERED:
            self._routed.popitem(last=False)
        if not learned or how == "moved":  # a moved request's ledger entry is replaced (same id)
            self.mirror.pre_request(request, result)  # queued for the actors until the mirror attaches

    def _result_for(self, result: SchedulingResult | None, replica_name: str) -> SchedulingResult:
        """The decision as it was carried out: Serve sent the request to `replica_name` (back-pressure
        moved it, or the fallback chose it), so that is what the stateful plugins must learn."""
        replica = self._replicas_by_name(replica_name)
        endpoint = self.endpoint_of(replica) if replica is not None else Endpoint(replica_name)
        if result is None:
            return SchedulingResult({self._first_profile: ProfileRunResult([endpoint])}, self._first_profile)
        results = dict(result.profile_results)
        results[result.primary_profile_name] = ProfileRunResult([endpoint])
        return SchedulingResult(results, result.primary_profile_name, result.prefill_profile_name)

    def _replicas_by_name(self, name: str) -> RunningReplica | None:
        for rid, replica in self.curr_replicas.items():
            if rid.unique_id == name:
                return replica
        return None

    def _completed_event(self, iid: str, replica_name: str) -> None:
        routed = self._routed.get(iid)
        if routed is None or routed[1] != replica_name:  # not routed here (e.g. a rejected attempt)
            return
        del self._routed[iid]
        self.counters.completed += 1
        if self._first_tokens is not None:
            self._first_tokens.completed(replica_name, iid)
        self.mirror.response_complete(routed[0], replica_name)


_routers = routers  # the name tests and benchmarks used before the stats had their own module
__all__ = [
    "EPPRequestRouter",
    "RoutedRequest",
    "RouterConfigError",
    "RouterCounters",
    "percentiles_ms",
    "read_config",
    "recent_decisions",
    "request_of",
    "router_stats",
]  # fmt: skip
