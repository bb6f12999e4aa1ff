"""The ProfileRunner of the Ray path: the profiles of one round run at the same time, each in its
profile actor, with concurrent requests coalesced into one call per actor.

A profile may run as several shards (`profile_shards`): a request's calls and events all go to
the shard its key picks (serve_app/gateway/shard_key.py), the same shard index in every profile."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection
from typing import Any

from actors.channel import ChannelClient, Unsendable
from actors.protocol import ProfileCall, ProfileEvent, ProfileOutcome, StandbyPair
from scheduler import CycleState, Endpoint, ErrorCode, LLMRequest, ProfileRunResult, SchedulingError, SchedulingResult
from scheduler.cycle_state import profile_error_key
from scheduler.lifecycle import LifecycleEvent
from scheduler.plugins.support.prefix.hashing import DEFAULT_BLOCK_SIZE_TOKENS
from scheduler.trace import SchedulingTrace
from serve_app.gateway.batcher import ActorBatcher
from serve_app.gateway.failover_link import FailoverLink, actor_gone
from serve_app.gateway.shard_key import ShardKey
from serve_app.gateway.tracing import current_spans

ROUND_TRIP = "ray_epp_profile_actor_round_trip_seconds"
CALLS = "ray_epp_profile_actor_calls_total"
FAILURES = "ray_epp_profile_actor_failures_total"


class RayProfileRunner:
    concurrent = True  # the profiles of a round run at the same time (the loop tells the handler)

    def __init__(
        self,
        profile_actors: dict[str, Any],
        body_fields: Collection[str],
        shard_key_tokens: int = DEFAULT_BLOCK_SIZE_TOKENS,
        shard_session_header: str | None = None,
        call_timeout_s: float = 10.0,
        recorder: Any = None,
        failover_after_s: float = 0.5,
    ) -> None:
        """`profile_actors`: profile name -> its actor handle, or the list of its shards' handles
        (every profile the same number); `body_fields`: what of a request's body the actors get (the
        config's `BuiltScheduler.body_fields`: the fields its plugins declare). A `StandbyPair` in
        place of a handle is an actor and its standby (serve_app/gateway/failover_link.py: a batch its
        primary fails as gone, or does not answer within `failover_after_s`, goes to the standby).
        The shard key: see serve_app/gateway/shard_key.py.
        A call that has no answer after `call_timeout_s` (the actor frozen, or restarting for
        longer) fails its profile: the request gets its error instead of waiting without end.
        `recorder` (a MetricsRecorder) counts each actor's round trips, calls, failures and
        failovers (`ray_epp_profile_actor_*`)."""
        shards = {n: list(h) if isinstance(h, list | tuple) else [h] for n, h in profile_actors.items()}
        counts = {len(hs) for hs in shards.values()}
        if len(counts) > 1 or 0 in counts:
            raise ValueError(f"every profile needs the same number of shards, at least 1 (got {sorted(counts)})")
        self.shard_key = ShardKey(counts.pop() if counts else 1, shard_key_tokens, shard_session_header)
        self.actors = {n: primary_of(hs[0]) for n, hs in shards.items()}
        self.body_fields = tuple(body_fields)

        def link(handle: Any, labels: tuple[str, str]) -> ActorLink | FailoverLink:
            if not isinstance(handle, StandbyPair):
                return ActorLink(handle, call_timeout_s, recorder, labels)
            pair = (
                ActorLink(handle.primary, call_timeout_s, recorder, labels),
                ActorLink(handle.standby, call_timeout_s),
            )
            return FailoverLink(*pair, call_timeout_s, failover_after_s, recorder, labels)

        # One batcher per actor carries both the calls and the events (decisions, completions), so
        # a request costs one actor round trip, not three.
        self.links = {n: [link(h, (n, str(i))) for i, h in enumerate(hs)] for n, hs in shards.items()}
        self._batchers = {
            n: [ActorBatcher(x.run_batch, split_on=item_may_be_at_fault) for x in links]
            for n, links in self.links.items()
        }
        self._recorder = recorder
        self._call_labels = {n: [(n, str(i)) for i in range(len(hs))] for n, hs in shards.items()}

    async def __call__(
        self,
        names: list[str],
        request: LLMRequest,
        cycle_state: CycleState,
        endpoints: list[Endpoint] | None,
        trace: SchedulingTrace | None,
    ) -> dict[str, ProfileRunResult | None]:
        # `endpoints` None (the gateway): each actor runs on its datastore snapshot; a list (a caller
        # that knows its pool, e.g. a Serve request router or a benchmark) travels with the call.
        spans = current_spans()  # a traced request: its schedule span's context rides in the call
        traceparent = spans.profile_traceparent() if spans is not None else None
        sent = request.with_body_fields(self.body_fields)
        call = ProfileCall(sent, cycle_state, trace is not None, endpoints, traceparent)
        shard = self.shard_key.shard_of(request)
        if len(names) == 1:
            outcomes = [await self._run_one(names[0], call, shard)]
        else:  # the profiles of one round run at the same time, each in its own actor
            outcomes = await asyncio.gather(*(self._run_one(n, call, shard) for n in names))
        results: dict[str, ProfileRunResult | None] = {}
        for name, outcome in zip(names, outcomes, strict=True):
            if spans is not None:
                spans.profile_run(name, shard, outcome)
            if outcome.error is not None:
                cycle_state.write(profile_error_key(name), outcome.error)
            if trace is not None and outcome.trace is not None:
                trace.profiles[name] = outcome.trace
            results[name] = outcome.result
        return results

    async def _run_one(self, name: str, call: ProfileCall, shard: int = 0) -> ProfileOutcome:
        if self._recorder is not None:
            self._recorder.inc(CALLS, self._call_labels[name][shard])
        try:
            return await self._batchers[name][shard].call(call)
        except Exception as err:  # a dead or restarting profile actor fails this profile, not the gateway
            which = name if self.shard_key.shards == 1 else f"{name} (shard {shard})"
            error = SchedulingError(ErrorCode.SERVICE_UNAVAILABLE, f"profile actor {which!r} unavailable: {err}")
            return ProfileOutcome(None, error, None, 0, 0.0, 0.0)

    def pre_request(self, request: LLMRequest, result: SchedulingResult) -> None:
        """Every profile's actor (of the request's shard) learns the decision (its stateful
        plugins, e.g. the prefix index)."""
        event = ProfileEvent.of(LifecycleEvent.PRE_REQUEST, request, result, body_fields=self.body_fields)
        self._notify(request, event)

    def response_first_token(self, request: LLMRequest, endpoint_name: str) -> None:
        """Plugins that track prefill work in flight learn this request's first token arrived."""
        self._notify(request, ProfileEvent.of(LifecycleEvent.FIRST_TOKEN, request, endpoint_name=endpoint_name))

    def response_complete(self, request: LLMRequest, endpoint_name: str) -> None:
        event = ProfileEvent.of(LifecycleEvent.RESPONSE_COMPLETE, request, endpoint_name=endpoint_name)
        self._notify(request, event)

    def withdraw(self, request: LLMRequest) -> None:
        """The request failed before it was sent: the actors take back the decisions they told
        their ledgers when they made them (actors/tentative_decisions.py)."""
        self._notify(request, ProfileEvent.of(LifecycleEvent.WITHDRAW, request))

    def _notify(self, request: LLMRequest, event: ProfileEvent) -> None:
        shard = self.shard_key.shard_of(request)  # kept in the request's derived data: the deciding shard
        for batchers in self._batchers.values():
            batchers[shard].notify(event)


def item_may_be_at_fault(err: BaseException) -> bool:
    """Whether a failed batch is worth sending again item by item: not when the actor itself is
    gone (each item would only wait for it again)."""
    return not actor_gone(err)


def primary_of(handle: Any) -> Any:
    return handle.primary if isinstance(handle, StandbyPair) else handle


class ActorLink:
    """run_batch on one profile actor: over its same-node channel when it has one, else (and
    whenever the channel fails) as a Ray actor call. A batch has `call_timeout_s` in all, a wait
    for a restarting actor included: a frozen actor (stopped, stuck) answers neither way, and
    without the bound every later request to it would queue behind the first."""

    RETRY_CHANNEL_AFTER_S = 1.0

    def __init__(
        self, handle: Any, call_timeout_s: float = 10.0, recorder: Any = None, labels: tuple[str, str] = ("", "")
    ) -> None:
        self.handle = handle
        self.call_timeout_s = call_timeout_s
        self._recorder = recorder  # round trips and failures, labelled (profile, shard)
        self._labels = labels
        self._by = {t: (*labels, t) for t in ("channel", "ray")}
        self._client: ChannelClient | None = None
        self._next_try = 0.0
        self._connecting: asyncio.Task | None = None
        # Batches sent as Ray calls and not answered yet. A newly connected channel is used only once
        # none is left: otherwise a batch could overtake an earlier one on the other transport, and
        # a decision be made before the events sent ahead of it were applied.
        self._ray_in_flight = 0

    async def run_batch(self, items: list, deadline: float | None = None, wait_for_restart: bool = True) -> list:
        """`deadline` (loop time; default `call_timeout_s` from now) bounds the whole batch.
        `wait_for_restart` False: an actor that is gone fails the batch at once instead of being
        waited for (a standby can take it: serve_app/gateway/failover_link.py)."""
        loop = asyncio.get_running_loop()
        if deadline is None:
            deadline = loop.time() + self.call_timeout_s
        bound = deadline - loop.time()
        started = time.perf_counter()
        try:
            out, transport = await self._run_batch(items, deadline, wait_for_restart)
        except Unsendable:  # the batch's fault, not the actor's
            raise
        except Exception as err:
            if self._recorder is not None:
                self._recorder.inc(FAILURES, self._labels)
            if isinstance(err, TimeoutError):
                raise TimeoutError(f"no answer within {bound:.3g} s") from None
            raise
        if self._recorder is not None:
            self._recorder.observe(ROUND_TRIP, time.perf_counter() - started, self._by[transport])
        return out

    async def _run_batch(self, items: list, deadline: float, wait_for_restart: bool) -> tuple[list, str]:
        """The answers, and the transport that carried them ("channel" or "ray")."""
        loop = asyncio.get_running_loop()
        client = self._client
        if client is not None and not client.closed and self._ray_in_flight == 0:
            try:
                async with asyncio.timeout_at(deadline):
                    return await client.request(items), "channel"
            except Unsendable:  # this batch's fault, not the channel's: keep the channel
                raise
            except TimeoutError:  # the actor behind the channel is frozen: Ray calls could not do better
                self._client = None
                await client.close()
                raise
            except Exception:  # the channel or the actor behind it failed: this batch goes by Ray
                self._client = None
                await client.close()
        self._maybe_connect()
        from ray.exceptions import ActorUnavailableError, RayActorError

        # A batch is safe to send again: profile runs are pure, and applying its events twice is
        # harmless (a request's decision replaces its earlier one in the ledgers, a completion
        # releases it once, the prefix index learns the same blocks again).
        self._ray_in_flight += 1
        try:
            while True:
                try:
                    async with asyncio.timeout_at(deadline):
                        return await self.handle.run_batch.remote(items), "ray"
                except (ActorUnavailableError, RayActorError):  # restarting: Ray brings it back; wait, bounded
                    if not wait_for_restart or loop.time() + 0.1 > deadline:
                        raise
                    await asyncio.sleep(0.1)
        finally:
            self._ray_in_flight -= 1

    def _maybe_connect(self) -> None:
        loop = asyncio.get_running_loop()
        if self._connecting is None and loop.time() >= self._next_try:
            self._next_try = loop.time() + self.RETRY_CHANNEL_AFTER_S
            self._connecting = loop.create_task(self._connect())

    async def _connect(self) -> None:
        try:
            import ray

            endpoint = await self.handle.channel_endpoint.remote()
            if endpoint is None or endpoint["node_id"] != ray.get_runtime_context().get_node_id():
                return  # another node (or no channel): Ray calls it is
            client = ChannelClient(endpoint["port"], endpoint["token"])
            await client.connect()
            self._client = client
        except Exception:  # the actor restarting or gone: Ray calls until the next try
            pass
        finally:
            self._connecting = None
