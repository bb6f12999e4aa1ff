"""What of a request's body the plugins read: each plugin declares its fields (`Plugin.body_fields`),
a built config knows their union, and that union is all of the body a profile actor gets
(actors/protocol.py). A plugin that read a field it did not declare would work in process and
silently see nothing on the Ray path, so the check below holds plugins to their word.

With RAY_EPP_CHECK_BODY_READS=1 (the test suite sets it), every plugin built from a config is
called, at each method of its roles that takes the request, with a copy whose body holds only what
the plugin may read: its own fields and those of the plugins it looked up while it was built (a
scorer reads through its producer). Reading any other field by name raises UndeclaredBodyField, in
process and in a profile actor alike. Off, nothing is wrapped and plugins get the request itself."""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Collection, Mapping
from dataclasses import fields as dataclass_fields
from typing import Any

from scheduler.interfaces import ROLES, Plugin
from scheduler.types import LLMRequest

CHECK_ENV = "RAY_EPP_CHECK_BODY_READS"

# The fields `LLMRequest.prompt_text` reads: a completion prompt, or chat messages.
PROMPT_FIELDS = frozenset({"prompt", "messages"})
# What `LLMRequest.cache_salt` reads: vLLM's salt that separates one tenant's prefix cache.
CACHE_SALT_FIELDS = frozenset({"cache_salt"})
# The client's limits on output tokens, in the order they are read (chat, completions, Responses).
OUTPUT_LIMIT_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


class UndeclaredBodyField(RuntimeError):
    """A plugin read a body field it did not declare (not a KeyError: a plugin's own `except
    KeyError` must not hide it)."""


def declared_body_fields(plugin: Plugin | type[Plugin]) -> frozenset[str]:
    """The fields a plugin declares: its class's and every base's (a mixin that reads the prompt
    declares it once for all its users), and its instance's own when it set some in `setup`."""
    cls = plugin if isinstance(plugin, type) else type(plugin)
    fields = frozenset().union(*(vars(c).get("body_fields", ()) for c in cls.__mro__))
    own = vars(plugin).get("body_fields") if not isinstance(plugin, type) else None
    return fields | own if own else fields


def readable_body_fields(
    plugins: Mapping[str, Plugin], uses: Mapping[str, Collection[str]]
) -> dict[str, frozenset[str]]:
    """Per plugin name: what it may read, its declared fields and those of every plugin it uses
    (`uses`: the names each looked up while built), through any depth."""

    def reach(name: str) -> set[str]:
        seen, todo = {name}, [name]
        while todo:
            for used in uses.get(todo.pop(), ()):
                if used in plugins and used not in seen:
                    seen.add(used)
                    todo.append(used)
        return seen

    return {name: frozenset().union(*(declared_body_fields(plugins[n]) for n in reach(name))) for name in plugins}


def checking_body_reads() -> bool:
    return os.environ.get(CHECK_ENV, "") not in ("", "0")


class CheckedBody(dict):
    """A body that holds only the fields its reader may read, and says so when another is asked for."""

    __slots__ = ("fields", "full", "reader")

    def __init__(self, full: dict[str, Any], fields: frozenset[str], reader: str) -> None:
        super().__init__((k, full[k]) for k in fields if k in full)
        self.full = full
        self.fields = fields
        self.reader = reader

    def _refuse(self, key: Any) -> UndeclaredBodyField:
        return UndeclaredBodyField(
            f"{self.reader} reads the body field {key!r} without declaring it in `body_fields` "
            f"(it may read {sorted(self.fields) or 'none'}): a profile actor would not get it"
        )

    def __getitem__(self, key: Any) -> Any:
        if key not in self.fields:  # whether or not this body has it: the next one may
            raise self._refuse(key)
        return dict.__getitem__(self, key)

    def get(self, key: Any, default: Any = None) -> Any:
        if key not in self.fields:
            raise self._refuse(key)
        return dict.get(self, key, default)

    def __contains__(self, key: Any) -> bool:
        if key not in self.fields:
            raise self._refuse(key)
        return dict.__contains__(self, key)


def _request_params() -> dict[type[Plugin], dict[str, int]]:
    """Per role, its methods that take the request and where (the position after `self`)."""
    out: dict[type[Plugin], dict[str, int]] = {}
    for role in ROLES:
        methods = {}
        for name, fn in vars(role).items():
            if not name.startswith("_") and inspect.isfunction(fn):
                params = list(inspect.signature(fn).parameters)
                if "request" in params:
                    methods[name] = params.index("request") - 1
        out[role] = methods
    return out


_REQUEST_PARAMS = _request_params()


def check_body_reads(plugin: Plugin, fields: frozenset[str]) -> None:
    """Make each of `plugin`'s role methods that takes the request see only `fields` of its body."""
    reader = f"plugin {plugin.name!r} (type {plugin.type_name})"
    for role, methods in _REQUEST_PARAMS.items():
        if isinstance(plugin, role):
            for name, index in methods.items():
                setattr(plugin, name, _guarded(getattr(plugin, name), index, fields, reader))


_REQUEST_FIELDS = tuple(f.name for f in dataclass_fields(LLMRequest))


def _shallow_copy(request: LLMRequest) -> LLMRequest:
    """The same request in another object, its values shared (a tenth of `copy.copy`'s time)."""
    seen = LLMRequest.__new__(LLMRequest)
    for name in _REQUEST_FIELDS:
        setattr(seen, name, getattr(request, name))
    return seen


def _guarded(method: Callable[..., Any], index: int, fields: frozenset[str], reader: str) -> Callable[..., Any]:
    def view(request: LLMRequest) -> LLMRequest:
        seen = _shallow_copy(request)  # the same request otherwise: its derived values are shared
        full = request.body.full if isinstance(request.body, CheckedBody) else request.body
        seen.body = CheckedBody(full, fields, reader)
        return seen

    def call(*args: Any, **kwargs: Any) -> Any:
        if len(args) > index and isinstance(args[index], LLMRequest):
            args = (*args[:index], view(args[index]), *args[index + 1 :])
        elif isinstance(kwargs.get("request"), LLMRequest):
            kwargs["request"] = view(kwargs["request"])
        return method(*args, **kwargs)

    return call
