"""The profiles run in the gateway replica itself, on its own view of the pool (gateway setting
`decide_in_replica`; docs/DESIGN.md, "Deciding in the replica").

Why: a decision through a profile actor costs the replica a call (the request's scheduling view
pickled, a same-node socket or a Ray task, the outcome unpickled) and the actor its own process's
CPU; with a handful of pods the profile run itself is a small part of that. Where no other
process needs this replica's plugin state — one gateway replica, or replicas that may each keep
their own prefix index and ledgers, as GIE's EPP replicas do — running the profiles here removes
the hop. What it gives up: the state is this replica's (lost with it, not shared with other
replicas or Serve routers), no standby, no profile shards, and no KV-event subscriptions (the
precise prefix index needs the profile actors).

The rules are the profile actor's (actors/profile_actor.py): a decision counts in the in-flight
ledgers at once, until its PreRequest (actors/tentative_decisions.py); the events reach each
plugin through the same dispatcher (scheduler/lifecycle.py)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping

from actors.tentative_decisions import TentativeDecisions
from scheduler import CycleState, Endpoint, EndpointPickerConfig, LLMRequest, ProfileRunResult, SchedulingResult
from scheduler.config import DecideIn, build_plugins
from scheduler.config.placement import ACTOR_ONLY_ROLES
from scheduler.cycle_state import profile_error_key
from scheduler.errors import ErrorCode, SchedulingError
from scheduler.interfaces import Plugin, PluginTimer
from scheduler.lifecycle import Lifecycle
from scheduler.profile import SchedulerProfile
from scheduler.scheduler import run_profile
from scheduler.trace import SchedulingTrace

log = logging.getLogger("ray_epp.gateway.local")

NO_ENDPOINTS = "no ready endpoints in the pool"


class InReplicaUnsupported(ValueError):
    """The configuration needs what only the profile actors do."""


def refuse_actor_only_plugins(plugins: Iterable[Plugin]) -> None:
    """A plugin with a role only a profile actor can serve (a KV-event sink) can not run here."""
    _refuse({p.name: why for p in plugins for role, why in ACTOR_ONLY_ROLES.items() if isinstance(p, role)})


def check_in_replica(config: EndpointPickerConfig, profile_shards: int = 1) -> None:
    """At launch: refuse a configuration the replica can not decide for on its own (a plugin that
    the placement keeps in a profile actor when the replica decides: scheduler/config/placement.py)."""
    if profile_shards > 1:
        raise InReplicaUnsupported(
            f"decide_in_replica: profile_shards is {profile_shards}, but each replica runs one copy of "
            "each profile; leave one of the two off"
        )
    _refuse(build_plugins(config, decide_in=DecideIn.REPLICA).needs_actor())


def _refuse(need: Mapping[str, str]) -> None:
    if need:
        why = "; ".join(f"{name} {reason}" for name, reason in need.items())
        raise InReplicaUnsupported(f"decide_in_replica: {why}; leave decide_in_replica off for this configuration")


class LocalProfileRunner:
    concurrent = False  # one process: the profiles of a round run one after the other

    def __init__(
        self,
        profiles: Mapping[str, SchedulerProfile],
        endpoints: Callable[[], list[Endpoint]],
        timer: PluginTimer | None = None,
        hooked_elsewhere: Iterable[Plugin] = (),
    ) -> None:
        """`endpoints`: the replica's current view of the pool. `hooked_elsewhere`: plugins whose
        lifecycle events the gateway already gives them (those placed in it), told nothing here."""
        skip = {id(p) for p in hooked_elsewhere}
        plugins: dict[int, Plugin] = {}
        for profile in profiles.values():
            for plugin in profile.plugins():
                plugins.setdefault(id(plugin), plugin)
        refuse_actor_only_plugins(plugins.values())
        self._profiles = dict(profiles)
        self._endpoints = endpoints
        self._timer = timer
        self._hooks = Lifecycle(p for i, p in plugins.items() if i not in skip)
        self._tentative = {
            name: TentativeDecisions(Lifecycle(p for p in profile.plugins() if id(p) not in skip), name)
            for name, profile in self._profiles.items()
        }

    @property
    def profiles(self) -> dict[str, SchedulerProfile]:
        """The profiles this replica runs."""
        return self._profiles

    async def __call__(
        self,
        names: list[str],
        request: LLMRequest,
        cycle_state: CycleState,
        endpoints: list[Endpoint] | None,
        trace: SchedulingTrace | None,
    ) -> dict[str, ProfileRunResult | None]:
        pool = endpoints if endpoints is not None else self._endpoints()
        out: dict[str, ProfileRunResult | None] = {}
        for name in names:
            tentative = self._tentative[name]
            tentative.expire()
            if not pool:
                cycle_state.write(profile_error_key(name), SchedulingError(ErrorCode.SERVICE_UNAVAILABLE, NO_ENDPOINTS))
                out[name] = None
                continue
            try:
                result = run_profile(self._profiles[name], request, cycle_state, pool, trace, self._timer)
            except Exception as err:  # a plugin bug fails this profile, not the replica
                log.exception("profile %s failed on request %s", name, request.request_id)
                message = f"profile {name!r} failed: {type(err).__name__}: {err}"
                cycle_state.write(profile_error_key(name), SchedulingError(ErrorCode.INTERNAL, message))
                result = None
            tentative.tell(request, result)
            out[name] = result
        return out

    # ---- what the stateful plugins learn (the profile actor's `_apply`, in this process) ----

    def pre_request(self, request: LLMRequest, result: SchedulingResult) -> None:
        self._settle(request)
        self._hooks.pre_request(request, result)

    def response_first_token(self, request: LLMRequest, endpoint_name: str) -> None:
        self._settle(request)
        self._hooks.response_first_token(request, endpoint_name)

    def response_complete(self, request: LLMRequest, endpoint_name: str) -> None:
        self._settle(request)
        self._hooks.response_complete(request, endpoint_name)

    def withdraw(self, request: LLMRequest) -> None:
        for tentative in self._tentative.values():
            tentative.withdraw(request)

    def _settle(self, request: LLMRequest) -> None:
        for tentative in self._tentative.values():
            tentative.settle(request.request_id)
