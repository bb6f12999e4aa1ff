"""Instantiate a loaded config's plugins and assemble its profiles and handler."""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import ValidationError

from scheduler.body_fields import check_body_reads, checking_body_reads, readable_body_fields
from scheduler.config.data_flow import profile_producers
from scheduler.config.models import EndpointPickerConfig
from scheduler.errors import ConfigError
from scheduler.interfaces import Filter, Picker, Plugin, PluginHandle, Producer, ProfileHandler, Scorer, Screener
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


def build_plugins(cfg: EndpointPickerConfig, only_profiles: list[str] | None = None) -> BuiltScheduler:
    """Fresh plugin instances for `cfg` (already through `load_config`).

    A plugin referenced by several profiles is one instance, as in GIE. `only_profiles` builds
    just those profiles (a profile actor owns one). Every plugin is built either way: the body
    fields are the whole config's, so each actor gets the same body."""
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
        if spec is None:
            raise KeyError(f"no plugin named {name!r} in 'plugins'")
        if name in building:
            raise ValueError(f"plugins refer to each other in a cycle: {' -> '.join([*building, name])}")
        cls = plugin_class(spec.type)
        assert cls is not None  # checked by load_config
        building.append(name)
        try:
            params = cls.Parameters.model_validate(spec.parameters or {})
            built[name] = cls(name=name, params=params, handle=handle)
        finally:
            building.pop()
        return built[name]

    handle = PluginHandle(resolve, list(specs))
    for name, spec in specs.items():
        try:
            resolve(name)
        except (KeyError, ValueError, TypeError, ValidationError) as err:
            msg = err.args[0] if isinstance(err, KeyError) else str(err)
            errors.append(f"plugin {name!r} (type {spec.type}): {msg}")
    if errors:
        raise ConfigError(errors)
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
    if errors:
        raise ConfigError(errors)

    handler = next(p for p in built.values() if isinstance(p, ProfileHandler))
    problems = handler.validate_profiles([p.name for p in cfg.scheduling_profiles])
    if problems:
        raise ConfigError([f"plugin {handler.name!r} (type {handler.type_name}): {p}" for p in problems])
    body_fields = frozenset().union(*readable.values())
    return BuiltScheduler(handler, profiles, built, cfg.saturation_detector_ref, body_fields)
