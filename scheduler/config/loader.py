"""Load an EndpointPickerConfig: parse, validate, and apply GIE's defaults.

Every mistake becomes one line of a ConfigError naming the plugin and the field; no traceback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from scheduler.config.build import build_plugins
from scheduler.config.models import EndpointPickerConfig, PluginSpec, ProfilePluginRef, SchedulingProfileSpec
from scheduler.config.nesting import MAX_FILE_NESTING, nests_deeper_than
from scheduler.errors import ConfigError
from scheduler.interfaces import Filter, Picker, Plugin, ProfileHandler, Scorer, roles_of
from scheduler.registry import plugin_class, plugin_types

DEFAULT_PROFILE = "default"
DEFAULT_HANDLER = "single-profile-handler"
DEFAULT_PICKER = "max-score-picker"
DEFAULT_WEIGHT = 1.0
PROFILE_ROLES = (Filter, Scorer, Picker)


def load_config_file(path: str | Path) -> EndpointPickerConfig:
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise ConfigError([f"can not read config file {str(path)!r}: {err.strerror}"]) from None
    except UnicodeDecodeError as err:
        raise ConfigError([f"config file {str(path)!r} is not UTF-8 text: {err}"]) from None
    return load_config(text)


def load_config(source: str | dict[str, Any] | EndpointPickerConfig) -> EndpointPickerConfig:
    """A validated config with GIE's defaults applied; raises ConfigError listing every problem."""
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
        cfg = EndpointPickerConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError([_describe(e, data) for e in err.errors()]) from None

    errors: list[str] = []
    classes = _plugin_classes(cfg, errors)
    if errors:
        raise ConfigError(errors)
    _apply_defaults(cfg, classes)
    _check_profiles(cfg, classes, errors)
    if errors:
        raise ConfigError(errors)

    build_plugins(cfg)  # a trial build: what the plugins' own factories and the handler check
    return cfg


def dump_config(cfg: EndpointPickerConfig) -> dict[str, Any]:
    return cfg.model_dump(by_alias=True, exclude_none=True)


def _plugin_classes(cfg: EndpointPickerConfig, errors: list[str]) -> dict[str, type[Plugin]]:
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
            errors.append(f"{where}: unknown plugin type {spec.type!r} (known types: {', '.join(plugin_types())})")
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
                    f"{at}: plugin {ref.plugin_ref!r} (type {cls.type_name}) is not a filter, scorer or picker "
                    "and can not be used in a profile"
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
    handlers = [n for n, c in classes.items() if issubclass(c, ProfileHandler)]
    if len(handlers) > 1:
        errors.append(f"plugins: exactly one profile handler is allowed, found {handlers}")
    elif not handlers:
        errors.append(
            f"plugins: {len(cfg.scheduling_profiles)} scheduling profiles need a profile handler "
            "(e.g. disagg-profile-handler); none is configured"
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
