"""GIE's EndpointPickerConfig: parsing, validation, defaults, and building the plugins."""

from scheduler.config.build import BuiltScheduler, PlacedPlugins, build_for, build_plugins
from scheduler.config.loader import dump_config, load_config, load_config_file
from scheduler.config.models import (
    API_VERSIONS,
    EndpointPickerConfig,
    PluginSpec,
    ProfilePluginRef,
    SchedulingProfileSpec,
)
from scheduler.config.placement import DecideIn, Placement

__all__ = [
    "API_VERSIONS",
    "BuiltScheduler",
    "DecideIn",
    "EndpointPickerConfig",
    "PlacedPlugins",
    "Placement",
    "PluginSpec",
    "ProfilePluginRef",
    "SchedulingProfileSpec",
    "build_for",
    "build_plugins",
    "dump_config",
    "load_config",
    "load_config_file",
]
