"""Load an EndpointPickerConfig: parse, validate, and apply GIE's defaults.

Every mistake becomes one line of a ConfigError naming the plugin and the field; no traceback."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from scheduler.config.build import build_plugins
from scheduler.config.combined_prefix import expand_combined_prefix_scorers
from scheduler.config.flow_control import (
    DEFAULT_FAIRNESS_POLICY,
    DEFAULT_ORDERING_POLICY,
    DEFAULT_USAGE_LIMIT_POLICY,
    FEATURE_GATE,
    FlowControlSpec,
    PriorityBandSpec,
    parse_feature_gates,
)
from scheduler.config.models import EndpointPickerConfig, PluginSpec, ProfilePluginRef, SchedulingProfileSpec
from scheduler.config.nesting import MAX_FILE_NESTING, nests_deeper_than
from scheduler.config.placement import PROFILE_ROLES
from scheduler.config.refused import refusal
from scheduler.config.sections import check_sections
from scheduler.config.source import config_source
from scheduler.errors import ConfigError
from scheduler.interfaces import (
    FairnessPolicy,
    OrderingPolicy,
    Picker,
    Plugin,
    ProfileHandler,
    Scorer,
    UsageLimitPolicy,
    roles_of,
)
from scheduler.registry import plugin_class, plugin_types

log = logging.getLogger("ray_epp.config")

DEFAULT_PROFILE = "default"
DEFAULT_HANDLER = "single-profile-handler"
DEFAULT_PICKER = "max-score-picker"
DEFAULT_WEIGHT = 1.0


def load_config_file(spec: str | Path) -> EndpointPickerConfig:
    """A config by name (`default`, `pd`, ...), path or YAML text, validated."""
    return load_config(read_config_file(spec))


def read_config_file(spec: str | Path) -> str:
    """A config's text from a shipped config's name, a path or YAML text (config/source.py)."""
    return config_source(spec)[0]


def load_config(source: str | dict[str, Any] | EndpointPickerConfig) -> EndpointPickerConfig:
    """A validated config with GIE's defaults applied; raises ConfigError listing every problem."""
    cfg = parse_config(source)
    errors: list[str] = []
    expand_combined_prefix_scorers(cfg, errors)
    classes = plugin_classes(cfg, errors)
    check_sections(cfg, classes, errors)
    if errors:
        raise ConfigError(errors)
    _apply_defaults(cfg, classes)
    _check_profiles(cfg, classes, errors)
    _check_flow_control(cfg, classes, errors)
    if errors:
        raise ConfigError(errors)

    build_plugins(cfg)  # a trial build: what the plugins' own factories and the handler check
    return cfg


def parse_config(source: str | dict[str, Any] | EndpointPickerConfig) -> EndpointPickerConfig:
    """The document's shape checked (YAML, fields, types); plugins and defaults not yet looked at."""
    if isinstance(source, EndpointPickerConfig):
        data: Any = source.model_dump(by_alias=True, exclude_none=True)
    elif isinstance(source, str):
        if nests_deeper_than(source):
            raise ConfigError([f"the YAML nests deeper than {MAX_FILE_NESTING} levels"])
        try:
            data = yaml.safe_load(source)
        except yaml.YAMLError as err:
            raise ConfigError([f"not valid YAML: {err}"]) from None
        except RecursionError:  # PyYAML's parser recurses once per nesting level
            raise ConfigError(["the YAML nests deeper than the parser can follow (~1,000 levels)"]) from None
    else:
        data = source
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(["the config must be a YAML mapping (an EndpointPickerConfig)"])
    try:
        return EndpointPickerConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError([_describe(e, data) for e in err.errors()]) from None


def dump_config(cfg: EndpointPickerConfig) -> dict[str, Any]:
    return cfg.model_dump(by_alias=True, exclude_none=True)


def plugin_classes(cfg: EndpointPickerConfig, errors: list[str]) -> dict[str, type[Plugin]]:
    """Resolve each plugin's type and check its parameters; names default to the type."""
    classes: dict[str, type[Plugin]] = {}
    for i, spec in enumerate(cfg.plugins):
        if not spec.name:
            spec.name = spec.type
        where = f"plugins[{i}] {spec.name!r}"
        if spec.name in classes:
            errors.append(f"{where}: name {spec.name!r} is used by more than one plugin")
            continue
        cls = plugin_class(spec.type)
        if cls is None:
            errors.append(f"{where}: {unknown_type(spec.type)}")
            continue
        classes[spec.name] = cls
        missing = sorted(getattr(cls, "__abstractmethods__", ()))
        if missing:
            methods = ", ".join(f"{m}()" for m in missing)
            errors.append(
                f"{where} (type {spec.type}): class {cls.__name__} does not implement {methods}, "
                f"required by its roles ({', '.join(roles_of(cls))})"
            )
        try:
            cls.Parameters.model_validate(spec.parameters or {})
        except ValidationError as err:
            for e in err.errors():
                field = ".".join(["parameters", *(str(p) for p in e["loc"])])  # a model-level check has no loc
                msg = "unknown parameter" if e["type"] == "extra_forbidden" else e["msg"].removeprefix("Value error, ")
                errors.append(f"{where} (type {spec.type}): {field}: {msg}")
    return classes


def unknown_type(type_name: str) -> str:
    """Why a plugin type no class claims can not be built: llm-d's reason, or that it is unknown."""
    why = refusal(type_name)
    if why is not None:
        return f"plugin type {type_name!r} is llm-d's, but can not run in Ray EPP: {why}"
    return f"unknown plugin type {type_name!r} (known types: {', '.join(plugin_types())})"


def _apply_defaults(cfg: EndpointPickerConfig, classes: dict[str, type[Plugin]]) -> None:
    """GIE's scheduling defaults: a default profile, a single-profile handler, a max-score picker,
    scorer weight 1."""
    if not cfg.scheduling_profiles:
        refs = [ProfilePluginRef(pluginRef=n) for n, c in classes.items() if issubclass(c, PROFILE_ROLES)]
        cfg.scheduling_profiles = [SchedulingProfileSpec(name=DEFAULT_PROFILE, plugins=refs)]
    if len(cfg.scheduling_profiles) == 1 and not any(issubclass(c, ProfileHandler) for c in classes.values()):
        _add_plugin(cfg, classes, DEFAULT_HANDLER)
    picker = next((n for n, c in classes.items() if issubclass(c, Picker)), None)
    if picker is None:
        picker = _add_plugin(cfg, classes, DEFAULT_PICKER)
    for profile in cfg.scheduling_profiles:
        has_picker = False
        for ref in profile.plugins:
            cls = classes.get(ref.plugin_ref)
            if cls is None:
                continue
            if issubclass(cls, Scorer) and ref.weight is None:
                ref.weight = DEFAULT_WEIGHT
            has_picker = has_picker or issubclass(cls, Picker)
        if not has_picker:
            profile.plugins.append(ProfilePluginRef(pluginRef=picker))


def _add_plugin(cfg: EndpointPickerConfig, classes: dict[str, type[Plugin]], type_name: str) -> str:
    if type_name not in classes:
        cfg.plugins.append(PluginSpec(name=type_name, type=type_name))
        classes[type_name] = plugin_class(type_name)  # type: ignore[assignment]
    return type_name


def _check_profiles(cfg: EndpointPickerConfig, classes: dict[str, type[Plugin]], errors: list[str]) -> None:
    names = [p.name for p in cfg.scheduling_profiles]
    for name in {n for n in names if names.count(n) > 1}:
        errors.append(f"schedulingProfiles: profile name {name!r} is used more than once")
    for i, profile in enumerate(cfg.scheduling_profiles):
        where = f"schedulingProfiles[{i}] {profile.name!r}"
        pickers = []
        for j, ref in enumerate(profile.plugins):
            at = f"{where}.plugins[{j}]"
            cls = classes.get(ref.plugin_ref)
            if cls is None:
                errors.append(f"{at}: pluginRef {ref.plugin_ref!r} names no plugin in 'plugins'")
                continue
            if not issubclass(cls, PROFILE_ROLES):
                errors.append(
                    f"{at}: plugin {ref.plugin_ref!r} (type {cls.type_name}) is not a producer, filter, scorer or "
                    "picker and can not be used in a profile"
                )
            if ref.weight is not None and not issubclass(cls, Scorer):
                errors.append(
                    f"{at}: plugin {ref.plugin_ref!r} (type {cls.type_name}) is not a scorer; "
                    "only scorers take a weight"
                )
            if issubclass(cls, Picker):
                pickers.append(ref.plugin_ref)
        if len(pickers) > 1:
            errors.append(f"{where}: a profile has one picker, found {len(pickers)}: {pickers}")
    # A plugin llm-d runs without a profile reference (an Admitter) but that acts here only as a
    # profile's filter must be referenced, or it would be silently inactive.
    referenced = {ref.plugin_ref for profile in cfg.scheduling_profiles for ref in profile.plugins}
    for spec in cfg.plugins:
        cls = classes.get(spec.name)
        if cls is not None and getattr(cls, "needs_profile_reference", False) and spec.name not in referenced:
            errors.append(
                f"plugins: {spec.name!r} (type {cls.type_name}) acts only as a filter in a profile here "
                "(llm-d runs it as an Admitter); add it to a profile's plugins"
            )
    handlers = [n for n, c in classes.items() if issubclass(c, ProfileHandler)]
    if len(handlers) > 1:
        errors.append(f"plugins: exactly one profile handler is allowed, found {handlers}")
    elif not handlers:
        errors.append(
            f"plugins: {len(cfg.scheduling_profiles)} scheduling profiles need a profile handler "
            "(e.g. disagg-profile-handler); none is configured"
        )


def _check_flow_control(cfg: EndpointPickerConfig, classes: dict[str, type[Plugin]], errors: list[str]) -> None:
    """The `flowControl` gate and section as llm-d resolves them: with the gate on, every policy
    ref names a plugin of its role (the default ordering, fairness and usage-limit policies are
    added when not declared, as llm-d's ensureFlowControlLayer); without it the section's settings
    are ignored with a warning, as llm-d does. `saturationDetector.pluginRef` is honoured either way."""
    try:
        enabled = parse_feature_gates(cfg.feature_gates).get(FEATURE_GATE, False)
    except ValueError as err:
        errors.append(f"featureGates: {err}")
        return
    fc = cfg.flow_control  # saturationDetector, enableEviction: sections.py
    if not enabled:
        if fc is not None and fc.settings_configured():
            log.warning(
                "the flowControl section is set but the %r feature gate is off: its settings (other than "
                "saturationDetector) are ignored, as in llm-d; add featureGates: [%s] to use them",
                FEATURE_GATE,
                FEATURE_GATE,
            )
        return
    needed = {DEFAULT_ORDERING_POLICY, DEFAULT_FAIRNESS_POLICY, DEFAULT_USAGE_LIMIT_POLICY}
    if fc is not None:
        _check_flow_control_refs(fc, classes, needed, errors)
    for name in sorted(needed):
        if name not in classes:
            _add_plugin(cfg, classes, name)


def _check_flow_control_refs(
    fc: FlowControlSpec, classes: dict[str, type[Plugin]], needed: set[str], errors: list[str]
) -> None:
    """Each policy ref names a declared plugin of its role, or a default the loader adds."""

    def resolve(ref: str) -> type[Plugin] | None:
        return classes.get(ref) or (plugin_class(ref) if ref in needed else None)

    ref = fc.usage_limit_policy_plugin_ref
    cls = resolve(ref) if ref else None
    if ref and cls is None:
        errors.append(f"flowControl.usageLimitPolicyPluginRef: {ref!r} names no plugin in 'plugins'")
    elif cls is not None and not issubclass(cls, UsageLimitPolicy):
        errors.append(
            f"flowControl.usageLimitPolicyPluginRef: plugin {ref!r} (type {cls.type_name}) is not a usage-limit policy"
        )
    bands: list[tuple[str, PriorityBandSpec]] = [(f"priorityBands[{i}]", b) for i, b in enumerate(fc.priority_bands)]
    for where, band in (("defaultPriorityBand", fc.default_priority_band),
                        ("defaultNegativePriorityBand", fc.default_negative_priority_band)):  # fmt: skip
        if band is not None:
            bands.append((where, band))
    priorities = [b.priority for b in fc.priority_bands]
    for p in sorted({p for p in priorities if priorities.count(p) > 1}):
        errors.append(f"flowControl.priorityBands: priority {p} is configured more than once")
    for where, band in bands:
        for field, role, ref in (("orderingPolicyRef", OrderingPolicy, band.ordering_policy_ref),
                                 ("fairnessPolicyRef", FairnessPolicy, band.fairness_policy_ref)):  # fmt: skip
            if not ref:
                continue
            cls = resolve(ref)
            if cls is None:
                errors.append(f"flowControl.{where}.{field}: {ref!r} names no plugin in 'plugins'")
            elif not issubclass(cls, role):
                errors.append(
                    f"flowControl.{where}.{field}: plugin {ref!r} (type {cls.type_name}) is not "
                    f"{'an ordering' if role is OrderingPolicy else 'a fairness'} policy"
                )


def _describe(error: dict[str, Any], data: dict[str, Any]) -> str:
    """A pydantic error as 'path: message', naming the plugin or profile by name where it has one."""
    loc = list(error["loc"])
    parts: list[str] = []
    node: Any = data
    for key in loc:
        if isinstance(key, int) and isinstance(node, list) and key < len(node):
            node = node[key]
            label = node.get("name") or node.get("type") or node.get("pluginRef") if isinstance(node, dict) else None
            parts[-1] = f"{parts[-1]}[{key}]" + (f" {label!r}" if label else "")
        else:
            parts.append(str(key))
            node = node.get(key) if isinstance(node, dict) else None
    msg = error["msg"]
    if error["type"] == "extra_forbidden":
        msg = "unknown field"
    return f"{'.'.join(parts) or 'config'}: {msg}"
