"""Where each plugin of a config runs, computed from the roles it declares (`placement`).

Ray EPP runs one config in three kinds of process, each with its own instances of the plugins:

* a **gateway replica** (`serve_app/gateway/`): admission and flow control, the profile handler's
  rounds, the data preparers, the response hooks of the replica that answers;
* a **profile actor** (`actors/profile_actor.py`), one per profile: the profile's filters, scorers
  and picker, the screeners, and the KV-event sinks it feeds;
* a **Serve router** (`serve_app/llm_router/`): the handler, and a mirror of every profile's
  plugins that follows the profile actors.

A plugin runs where its roles need it, and where the plugins that look it up through their handle
run (a scorer's producer runs beside the scorer); a producer whose keys a data preparer reads runs
in the gateway replica too (the token producer, before the burst producer's window). The lifecycle
hooks (PreRequest, ResponseComplete, …) go with the plugin: each process tells the plugins it holds.
A plugin whose only roles are lifecycle hooks, and that nothing looks up, runs in the gateway
replica, which sees every event.

Who decides (`DecideIn`) moves the profiles: by default the profile actors run them; with the
gateway setting `decide_in_replica` the gateway replica runs them itself, so what a profile actor
would run runs in the replica, except a plugin whose role only an actor can serve
(`ACTOR_ONLY_ROLES`: a KV-event sink, fed by the event subscriptions only profile actors hold).
Such a plugin keeps its actor place, and `needs_actor` says which and why: a profile that reads it
can not be decided in the replica, so the launcher refuses the configuration rather than start an
actor that every decision would have to call again."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum

from scheduler.config.models import EndpointPickerConfig
from scheduler.interfaces import (
    DataPreparer,
    FairnessPolicy,
    Filter,
    KVEventSink,
    OrderingPolicy,
    PDDecider,
    Picker,
    Plugin,
    PreRequest,
    Producer,
    ProfileHandler,
    Responder,
    ResponseComplete,
    ResponseFirstToken,
    ResponseHeader,
    ResponseUsage,
    SaturationDetector,
    Scorer,
    Screener,
    UsageLimitPolicy,
)
from scheduler.profile import SchedulerProfile


class Placement(StrEnum):
    GATEWAY = "gateway replica"
    PROFILE_ACTOR = "profile actor"
    ROUTER = "Serve router"


class DecideIn(StrEnum):
    """Who runs the profiles for the gateway (the gateway setting `decide_in_replica`)."""

    PROFILE_ACTORS = "profile actors"
    REPLICA = "gateway replica"


GATEWAY, ACTOR, ROUTER = Placement.GATEWAY, Placement.PROFILE_ACTOR, Placement.ROUTER

# The roles that place a plugin, and where. The profile roles place it only when a profile lists it.
PROFILE_ROLES: tuple[type[Plugin], ...] = (Filter, Scorer, Picker, Producer)
ROLE_PLACEMENT: dict[type[Plugin], frozenset[Placement]] = {
    Filter: frozenset({ACTOR, ROUTER}),
    Scorer: frozenset({ACTOR, ROUTER}),
    Picker: frozenset({ACTOR, ROUTER}),
    Producer: frozenset({ACTOR, ROUTER}),  # run by the profile, before its filters
    Screener: frozenset({ACTOR, ROUTER}),  # every profile applies them
    KVEventSink: frozenset({ACTOR}),  # the profile actor subscribes to the pods' event streams
    ProfileHandler: frozenset({GATEWAY, ROUTER}),
    PDDecider: frozenset({GATEWAY, ROUTER}),  # asked by the handler
    SaturationDetector: frozenset({GATEWAY}),  # admission
    OrderingPolicy: frozenset({GATEWAY}),  # flow control's queue is the replica's
    FairnessPolicy: frozenset({GATEWAY}),
    UsageLimitPolicy: frozenset({GATEWAY}),
    DataPreparer: frozenset({GATEWAY}),  # where the request arrives
    ResponseHeader: frozenset({GATEWAY}),  # the replica that answers
    ResponseUsage: frozenset({GATEWAY}),
    Responder: frozenset({GATEWAY}),
}
# A plugin with no placing role but lifecycle hooks (and that nothing looks up) hears them here.
LIFECYCLE_ROLES: tuple[type[Plugin], ...] = (PreRequest, ResponseFirstToken, ResponseComplete)
LIFECYCLE_ONLY = frozenset({GATEWAY})
# Roles only a profile actor can serve, whoever decides, and why.
ACTOR_ONLY_ROLES: dict[type[Plugin], str] = {
    KVEventSink: "reads the pods' KV events, which only the profile actors subscribe to",
}


def role_places(role: type[Plugin], decide_in: DecideIn = DecideIn.PROFILE_ACTORS) -> frozenset[Placement]:
    """Where a role places its plugin: a profile actor's place is the replica's when it decides,
    unless only an actor can serve the role."""
    where = ROLE_PLACEMENT[role]
    if decide_in is DecideIn.REPLICA and ACTOR in where and role not in ACTOR_ONLY_ROLES:
        return (where - {ACTOR}) | {GATEWAY}
    return where


def placement(
    plugins: Mapping[str, Plugin],
    cfg: EndpointPickerConfig,
    uses: Mapping[str, Iterable[str]],
    profiles: Mapping[str, SchedulerProfile],
    decide_in: DecideIn = DecideIn.PROFILE_ACTORS,
) -> dict[str, frozenset[Placement]]:
    """Each plugin's places, in config order: its roles' (a profile role only when a profile
    lists it, or runs it: the producers its plugins need), joined with those of every plugin that
    looked it up while being built (`uses`); the gateway replica for a producer a data preparer
    reads. `decide_in`: who runs the profiles (`role_places`)."""
    in_profiles = {ref.plugin_ref for spec in cfg.scheduling_profiles for ref in spec.plugins}
    in_profiles |= {p.name for profile in profiles.values() for p in profile.plugins()}
    own: dict[str, set[Placement]] = {}
    for name, plugin in plugins.items():
        places: set[Placement] = set()
        for role in ROLE_PLACEMENT:
            if isinstance(plugin, role) and (role not in PROFILE_ROLES or name in in_profiles):
                places |= role_places(role, decide_in)
        own[name] = places
    used_by: dict[str, set[str]] = {name: set() for name in plugins}
    for user, used in uses.items():
        for name in used:
            if name in used_by:
                used_by[name].add(user)
    producer_of = {key: name for name, p in plugins.items() if isinstance(p, Producer) for key in p.produces}
    for name, plugin in plugins.items():  # what a data preparer reads is produced where it prepares
        if isinstance(plugin, DataPreparer) and GATEWAY in own[name]:
            for key in plugin.consumes:
                if key in producer_of:
                    own[producer_of[key]].add(GATEWAY)

    def reach(name: str, seen: set[str]) -> set[Placement]:
        places = set(own[name])
        for user in used_by[name] - seen:
            places |= reach(user, seen | {name, user})
        return places

    out: dict[str, frozenset[Placement]] = {}
    for name, plugin in plugins.items():
        places = reach(name, {name})
        if not places and not used_by[name] and _hooks_only(plugin):
            places = set(LIFECYCLE_ONLY)
        out[name] = frozenset(places)
    return out


def _hooks_only(plugin: Plugin) -> bool:
    return isinstance(plugin, LIFECYCLE_ROLES) and not any(isinstance(plugin, role) for role in ROLE_PLACEMENT)


def needs_actor(plugins: Mapping[str, Plugin], places: Mapping[str, frozenset[Placement]]) -> dict[str, str]:
    """The plugins placed in a profile actor, and why: when the replica decides, what it can not
    run (a role of `ACTOR_ONLY_ROLES`, or looked up by such a plugin)."""
    out: dict[str, str] = {}
    for name, where in places.items():
        if ACTOR in where:
            plugin = plugins[name]
            why = [reason for role, reason in ACTOR_ONLY_ROLES.items() if isinstance(plugin, role)]
            out[name] = "; ".join(why) or "looked up by a plugin that needs a profile actor"
    return out
