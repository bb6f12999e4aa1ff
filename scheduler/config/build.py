"""Instantiate a loaded config's plugins and assemble its profiles and handler."""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import ValidationError

from scheduler.body_fields import check_body_reads, checking_body_reads, readable_body_fields
from scheduler.config.data_flow import DATA_PREPARATION, made_producer_class, made_producers, profile_producers
from scheduler.config.models import EndpointPickerConfig
from scheduler.config.placement import DecideIn, Placement, needs_actor, placement
from scheduler.errors import ConfigError
from scheduler.interfaces import (
    DataPreparer,
    Filter,
    Picker,
    Plugin,
    PluginHandle,
    Producer,
    ProfileHandler,
    Scorer,
    Screener,
)
from scheduler.lifecycle import Lifecycle
from scheduler.profile import SchedulerProfile, WeightedScorer
from scheduler.registry import plugin_class


@dataclass(slots=True)
class BuiltScheduler:
    handler: ProfileHandler
    profiles: dict[str, SchedulerProfile]
    plugins: dict[str, Plugin]
    saturation_detector: str | None = None  # the detector the config names for admission, if any
    # The body fields the config's plugins read (scheduler/body_fields.py): all a profile actor gets.
    body_fields: frozenset[str] = field(default_factory=frozenset)
    # where each plugin runs (scheduler/config/placement.py), by plugin name
    placement: dict[str, frozenset[Placement]] = field(default_factory=dict)
    uses: dict[str, set[str]] = field(default_factory=dict)  # plugin -> the plugins it looked up
    decide_in: DecideIn = DecideIn.PROFILE_ACTORS  # who runs the profiles, which `placement` follows

    def needs_actor(self) -> dict[str, str]:
        """The plugins placed in a profile actor, and why (placement.needs_actor)."""
        return needs_actor(self.plugins, self.placement)

    def profiles_in_actors(self) -> list[str]:
        """The profiles that need an actor to run them: every one when the actors decide; when
        the replica does, those with a plugin only an actor can run (which the launcher refuses)."""
        if self.decide_in is DecideIn.PROFILE_ACTORS:
            return list(self.profiles)
        return [name for name in self.profiles if self.at(Placement.PROFILE_ACTOR, name)]

    def at(self, where: Placement, profile: str | None = None) -> list[Plugin]:
        """The plugins that run in `where`, in config order; with `profile` (a profile actor, a
        router's mirror of it), those of that profile: its own, the screeners, and what they use."""
        here = [name for name in self.plugins if where in self.placement.get(name, ())]
        if profile is not None:
            wanted = {p.name for p in self.profiles[profile].plugins()}
            wanted |= {name for name, p in self.plugins.items() if isinstance(p, Screener)}
            todo = list(wanted)
            while todo:
                for used in self.uses.get(todo.pop(), ()):
                    if used not in wanted:
                        wanted.add(used)
                        todo.append(used)
            here = [name for name in here if name in wanted]
        return [self.plugins[name] for name in here]


@dataclass(slots=True)
class PlacedPlugins:
    """A config's plugins as one process runs them (`build_for`)."""

    where: Placement
    built: BuiltScheduler
    plugins: list[Plugin]  # the ones that run here
    lifecycle: Lifecycle  # the events they hear, dispatched

    @property
    def profile(self) -> SchedulerProfile:
        """The one profile a profile actor (or a router's mirror of it) was built for."""
        [profile] = self.built.profiles.values()
        return profile


def build_for(
    cfg: EndpointPickerConfig,
    where: Placement,
    profile: str | None = None,
    handle: PluginHandle | None = None,
    decide_in: DecideIn = DecideIn.PROFILE_ACTORS,
) -> PlacedPlugins:
    """The one way a Ray EPP process builds its plugins: fresh instances of the whole config (the
    handler and the plugins look each other up), of which it runs those placed in `where` when
    `decide_in` runs the profiles; a profile actor, and a Serve router's mirror of one, only
    `profile` (ValueError when the config has no such profile)."""
    if profile is not None and profile not in {p.name for p in cfg.scheduling_profiles}:
        known = [p.name for p in cfg.scheduling_profiles]
        raise ValueError(f"profile {profile!r} is not in the config (profiles: {known})")
    built = build_plugins(cfg, only_profiles=None if profile is None else [profile], handle=handle, decide_in=decide_in)
    plugins = built.at(where, profile)
    return PlacedPlugins(where, built, plugins, Lifecycle(plugins))


def build_plugins(
    cfg: EndpointPickerConfig,
    only_profiles: list[str] | None = None,
    handle: PluginHandle | None = None,
    decide_in: DecideIn = DecideIn.PROFILE_ACTORS,
) -> BuiltScheduler:
    """Fresh plugin instances for `cfg` (already through `load_config`).

    A plugin referenced by several profiles is one instance, as in GIE. `only_profiles` builds
    just those profiles (a profile actor owns one). Every plugin is built either way: the body
    fields are the whole config's, so each actor gets the same body. `handle` gives the plugins
    their clocks and the seed of their generators (default: the real clocks, unseeded). `decide_in`:
    who runs the profiles, which the placement follows."""
    specs = {spec.name: spec for spec in cfg.plugins}
    built: dict[str, Plugin] = {}
    building: list[str] = []
    uses: dict[str, set[str]] = {}  # the plugins each one looked up while it was built
    errors: list[str] = []

    def resolve(name: str) -> Plugin:
        if building:
            uses.setdefault(building[-1], set()).add(name)
        if name in built:
            return built[name]
        spec = specs.get(name)
        cls = plugin_class(spec.type) if spec is not None else made_producer_class(name)
        if cls is None:  # a declared type is checked by load_config: this is an undeclared name
            raise KeyError(f"no plugin named {name!r} in 'plugins'")
        if name in building:
            raise ValueError(f"plugins refer to each other in a cycle: {' -> '.join([*building, name])}")
        building.append(name)
        try:
            params = cls.Parameters.model_validate((spec.parameters or {}) if spec is not None else {})
            built[name] = cls(name=name, params=params, handle=base.for_plugin(name))
        finally:
            building.pop()
        return built[name]

    base = PluginHandle(resolve, list(specs)) if handle is None else handle.with_siblings(resolve, list(specs))
    for name, spec in specs.items():
        try:
            resolve(name)
        except (KeyError, ValueError, TypeError, ValidationError) as err:
            msg = err.args[0] if isinstance(err, KeyError) else str(err)
            errors.append(f"plugin {name!r} (type {spec.type}): {msg}")
    if errors:
        raise ConfigError(errors)
    while made := made_producers(built.values(), built):  # llm-d's default producers (made_when_needed)
        for name in made:
            resolve(name)
    readable = readable_body_fields(built, uses)
    if checking_body_reads():
        for name, plugin in built.items():
            check_body_reads(plugin, readable[name])

    profiles: dict[str, SchedulerProfile] = {}
    screeners = [p for p in built.values() if isinstance(p, Screener)]  # they apply to every profile
    for spec in cfg.scheduling_profiles:
        if only_profiles is not None and spec.name not in only_profiles:
            continue
        profile = SchedulerProfile(spec.name, screeners=list(screeners))
        listed: list[Producer] = []
        for ref in spec.plugins:
            plugin = built[ref.plugin_ref]
            if isinstance(plugin, Producer):
                listed.append(plugin)
            if isinstance(plugin, Filter):
                profile.filters.append(plugin)
            if isinstance(plugin, Scorer):
                profile.scorers.append(WeightedScorer(plugin, ref.weight if ref.weight is not None else 1.0))
            if isinstance(plugin, Picker):
                profile.picker = plugin
        profile.producers = profile_producers(spec.name, profile.plugins(), listed, built.values(), errors)
        profiles[spec.name] = profile
    preparers = [p for p in built.values() if isinstance(p, DataPreparer)]
    profile_producers(DATA_PREPARATION, preparers, [], built.values(), errors)  # the keys they read have producers
    if errors:
        raise ConfigError(errors)

    handler = next(p for p in built.values() if isinstance(p, ProfileHandler))
    problems = handler.validate_profiles([p.name for p in cfg.scheduling_profiles])
    if problems:
        raise ConfigError([f"plugin {handler.name!r} (type {handler.type_name}): {p}" for p in problems])
    body_fields = frozenset().union(*readable.values())
    places = placement(built, cfg, uses, profiles, decide_in)
    return BuiltScheduler(handler, profiles, built, cfg.saturation_detector_ref, body_fields, places, uses, decide_in)
