"""What the gateway sends a profile actor and what comes back: plain slotted dataclasses, pickled by
Ray. A batch is a list of these, one per coalesced request. A request travels with the fields of
its body that the config's plugins declare (`LLMRequest.with_body_fields(BuiltScheduler.body_fields)`,
scheduler/body_fields.py), not the whole body: fewer bytes per call, and nothing else of a client's
body can make a batch unpicklable."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from scheduler import CycleState, Endpoint, LLMRequest, ProfileRunResult, SchedulingError, SchedulingResult
from scheduler.lifecycle import LifecycleEvent


@dataclass(slots=True)
class ProfileCall:
    """Run the actor's profile for `request`; `cycle_state` is the gateway's copy of the request's
    state (what earlier rounds and the handler wrote). `want_trace` asks for the decision trace."""

    request: LLMRequest
    cycle_state: CycleState
    want_trace: bool = False
    # The endpoints to run on, when the caller knows them (a Serve request router: its replicas and
    # their routing stats); None runs on the actor's datastore snapshot.
    endpoints: list[Endpoint] | None = None
    # The W3C traceparent of the gateway's scheduling span, when the request is traced
    # (serve_app/gateway/tracing.py): the actor answers with its run's span under it (ProfileOutcome.span).
    traceparent: str | None = None


@dataclass(slots=True)
class ProfileOutcome:
    """One call's result: `result` is None when the profile failed, and `error` then says why (the
    gateway writes it under `profile_error_key(name)` for the profile handler). `trace` is the
    profile's part of the decision trace (`ProfileTrace.to_json()`), when asked for.
    `snapshot_version` is the datastore version of the endpoints the profile ran on; `started` and
    `finished` are wall-clock times (time.time()) around this call."""

    result: ProfileRunResult | None
    error: SchedulingError | None
    trace: dict[str, Any] | None
    snapshot_version: int
    started: float
    finished: float
    # A traced call's span, timed by `started` and `finished`: the traceparent it came with, the
    # actor's pid and the endpoints it ran on (the gateway exports it).
    span: dict[str, Any] | None = None


@dataclass(slots=True)
class ProfileEvent:
    """Something the profile's stateful plugins must learn, riding in a run_batch with the calls:
    one of the lifecycle events that cross processes (`LifecycleEvent`: PRE_REQUEST, the final
    decision `result`; FIRST_TOKEN, the first streamed token came from `endpoint_name`;
    RESPONSE_COMPLETE, `endpoint_name` finished serving; WITHDRAW, the request failed before it was
    sent: take back the decision the actor told its ledgers). The receiver hands it to its
    `Lifecycle.deliver`. Events apply in order before the calls after them in the same batch, so
    request N's decision is known when request N+1 is scheduled. Their slot in the answer is None."""

    kind: LifecycleEvent
    request: LLMRequest
    result: SchedulingResult | None = None
    endpoint_name: str | None = None
    at: float = 0.0  # when it happened (time.time()), set by Serve request routers: their followers' lag

    @classmethod
    def of(
        cls,
        kind: LifecycleEvent,
        request: LLMRequest,
        result: SchedulingResult | None = None,
        endpoint_name: str | None = None,
        at: float = 0.0,
        body_fields: Collection[str] = (),
    ) -> ProfileEvent:
        """The event with a fresh copy of what it carries of the request: the decision with the
        `body_fields` the config's plugins read (`BuiltScheduler.body_fields`), the others without
        a body."""
        decision = kind == LifecycleEvent.PRE_REQUEST
        sent = request.with_body_fields(body_fields) if decision else request.without_body()
        return cls(LifecycleEvent(kind), sent, result, endpoint_name, at)


def as_served(endpoints: list[Endpoint]) -> list[Endpoint]:
    """Endpoints from a datastore snapshot, ready for plugins: freshness is the datastore's job.

    It serves only pods whose metrics actor reported within its staleness threshold and whose
    scrapes succeed; a metrics actor reports on change (and a heartbeat), so an idle pod's
    `update_time` can be a heartbeat old although its metrics are current. Set to 0 ("freshness not
    tracked"), the utilization detector judges these endpoints on queue and KV alone instead of
    calling an idle pool stale (and so saturated). The report's time stays in `reported_at`, for
    plugins that ask what was sent since the metrics were reported (lora-residency-scorer). The
    snapshot's objects are this process's own copies, changed in place."""
    for ep in endpoints:
        m = ep.metrics
        if m.update_time:
            m.reported_at = m.update_time
        m.update_time = 0.0
    return endpoints


@dataclass(slots=True, frozen=True)
class StandbyPair:
    """A profile actor (shard) and its standby on another Ray node (actors/launcher.py): what a
    gateway gets in place of a lone handle when the profile has a standby."""

    primary: Any
    standby: Any
