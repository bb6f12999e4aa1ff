"""Plugin factories registered by GIE / llm-d type name."""

from __future__ import annotations

import importlib
from typing import TypeVar

from scheduler.interfaces import Plugin

_REGISTRY: dict[str, type[Plugin]] = {}
_builtins_loaded = False

P = TypeVar("P", bound=type[Plugin])


def register(cls: P) -> P:
    """Class decorator: make a plugin buildable from config by its `type_name`."""
    if not cls.type_name:
        raise TypeError(f"{cls.__name__} has no type_name")
    existing = _REGISTRY.get(cls.type_name)
    if existing is not None and existing is not cls:
        raise TypeError(f"plugin type {cls.type_name!r} registered twice ({existing.__name__}, {cls.__name__})")
    _REGISTRY[cls.type_name] = cls
    return cls


def register_alias(type_name: str, cls: type[Plugin]) -> None:
    """Accept an older type name for a plugin (e.g. llm-d's `pd-profile-handler`)."""
    _REGISTRY[type_name] = cls


def plugin_class(type_name: str) -> type[Plugin] | None:
    _load_builtins()
    return _REGISTRY.get(type_name)


def plugin_types() -> list[str]:
    _load_builtins()
    return sorted(_REGISTRY)


def _load_builtins() -> None:
    global _builtins_loaded
    if not _builtins_loaded:
        _builtins_loaded = True
        importlib.import_module("scheduler.plugins")

