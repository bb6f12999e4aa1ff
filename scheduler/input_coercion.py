"""How values given to the public types (`Metrics`, `Endpoint`, `LLMRequest`) become the form the
plugins read, or a clear TypeError / ValueError where they enter instead of an AttributeError
inside a plugin on the first request.

The types call these from `__post_init__` only for a field whose type is not already the internal
one, so building them from well-typed values (the hot path) costs a few `type(x) is T` checks."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def whole_number(field: str, value: Any, minimum: int | None = 0) -> int:
    """An int (an integral float is accepted); bool, text and the like are a TypeError."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{field} must be an integer, got {type(value).__name__} {value!r}")
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError(f"{field} must be a whole number, got {value!r}")
        value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{field} must be >= {minimum}, got {value!r}")
    return value


def real_number(field: str, value: Any, minimum: float | None = 0.0) -> float:
    """A float (an int is accepted); NaN and values under `minimum` are a ValueError."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{field} must be a number, got {type(value).__name__} {value!r}")
    value = float(value)
    if value != value:
        raise ValueError(f"{field} must be a number, got NaN")
    if minimum is not None and value < minimum:
        raise ValueError(f"{field} must be >= {minimum}, got {value!r}")
    return value


def model_counts(field: str, value: Any) -> dict[str, int]:
    """`active_models` / `waiting_models`: a mapping of model (adapter) name to count, or any
    iterable of names (each counted 0, as a scrape of vLLM's adapter lists gives them)."""
    if value is None:
        return {}
    if isinstance(value, str | bytes):
        raise TypeError(f"{field} must be a list of model names or a mapping name -> count, got the string {value!r}")
    if isinstance(value, Mapping):
        pairs: Iterable[tuple[Any, Any]] = value.items()
    elif isinstance(value, Iterable):
        pairs = ((name, 0) for name in value)
    else:
        raise TypeError(
            f"{field} must be a list of model names or a mapping name -> count, got {type(value).__name__} {value!r}"
        )
    counts: dict[str, int] = {}
    for name, count in pairs:
        if not isinstance(name, str) or not name:
            raise TypeError(f"{field}: a model name must be a non-empty string, got {name!r}")
        counts[name] = whole_number(f"{field}[{name!r}]", count)
    return counts


def names(field: str, value: Any) -> frozenset[str]:
    """A set of names (e.g. excluded endpoints) from any iterable of strings."""
    if value is None:
        return frozenset()
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise TypeError(f"{field} must be a collection of names, got {type(value).__name__} {value!r}")
    out = frozenset(value)
    for name in out:
        if not isinstance(name, str):
            raise TypeError(f"{field}: a name must be a string, got {name!r}")
    return out


def text(field: str, value: Any, empty: bool = True) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{field} must be a string, got {type(value).__name__} {value!r}")
    if not empty and not value:
        raise ValueError(f"{field} must not be empty")
    return value


def text_map(field: str, value: Any) -> dict[str, str]:
    """Labels or headers: a mapping of string to string."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(f"{field} must be a mapping of string to string, got {type(value).__name__} {value!r}")
    for key, item in value.items():
        if not isinstance(key, str) or not isinstance(item, str):
            raise TypeError(f"{field} must map strings to strings, got {key!r}: {item!r}")
    return dict(value)


def plain_dict(field: str, value: Any) -> dict[Any, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(f"{field} must be a mapping, got {type(value).__name__} {value!r}")
    return dict(value)
