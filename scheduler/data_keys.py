"""Typed, named keys for the data plugins hand each other (llm-d's DataKey: a data type and the
producer that publishes it), and the typed store a request carries for values derived from it.

A key names what the value is (`name`) and who writes it (`producer`: a plugin's instance name;
llm-d's default is the producer's type name, which is also its name when the config gives none).
Producers declare the keys they write (`Producer.produces`), consumers those they read
(`Plugin.consumes`); the config build checks that every consumed key has a producer in the
profile (scheduler/config/data_flow.py). `DataKey[T]` carries the value's type for the type
checker: `cycle_state.get(KEY)` is a `T | None`.

Two places hold keyed data: the CycleState (one scheduling call: what producers found for the
filters and scorers; the gateway copies it to profile actors) and a request's `RequestData`
(values derived from the request that outlive the call: the prompt text, its tokens and block
hashes, what a plugin has learned of it). `RequestData` stays in its process: a request sent to
another process arrives without it, and what a profile actor needs travels as a field of the
request or the call (actors/protocol.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

if TYPE_CHECKING:
    from scheduler.interfaces import PluginHandle

T = TypeVar("T")
D = TypeVar("D")


@dataclass(frozen=True, slots=True)
class DataKey(Generic[T]):
    """What a value is and which plugin writes it. Two keys are the same key when both parts are."""

    name: str
    producer: str = ""

    def of(self, producer: str) -> DataKey[T]:
        """The same data as written by the plugin named `producer` (unchanged when empty)."""
        return self if not producer or producer == self.producer else DataKey(self.name, producer)

    def __str__(self) -> str:
        return f"{self.name}/{self.producer}" if self.producer else self.name


def consumed_key(handle: PluginHandle, key: DataKey[T], producer_name: str, field: str, what: str) -> DataKey[T]:
    """`key` as written by the producer that a consumer's parameter `field` names (`producer_name`),
    else by the key's default producer: what the consumer declares in `consumes`. A ValueError (a
    config error) when the name is no plugin, or one that writes no such key (`what` it writes); a
    default producer missing from the config is the build's data-flow check to report."""
    key = key.of(producer_name)
    names = handle.plugin_names()
    if producer_name and names and producer_name not in names:
        raise ValueError(f"{field} {producer_name!r} names no plugin in 'plugins'")
    if key.producer in names:
        plugin = handle.plugin(key.producer)
        if key not in getattr(plugin, "produces", ()):
            article = "an" if plugin.type_name[:1] in "aeiou" else "a"
            raise ValueError(f"{field} {key.producer!r} is {article} {plugin.type_name}, which produces no {what}")
    return key


class RequestData:
    """Values derived from one request, keyed by DataKey; local to the process that derived them."""

    __slots__ = ("_values",)

    def __init__(self) -> None:
        self._values: dict[DataKey[Any], Any] = {}

    @overload
    def get(self, key: DataKey[T]) -> T | None: ...
    @overload
    def get(self, key: DataKey[T], default: D) -> T | D: ...
    def get(self, key: DataKey[Any], default: Any = None) -> Any:
        return self._values.get(key, default)

    def put(self, key: DataKey[T], value: T) -> None:
        self._values[key] = value

    def pop(self, key: DataKey[T]) -> T | None:
        return self._values.pop(key, None)

    def clear(self) -> None:
        self._values.clear()

    def __contains__(self, key: object) -> bool:
        return key in self._values

    def __len__(self) -> int:
        return len(self._values)

    def __reduce__(self) -> tuple[type[RequestData], tuple[()]]:
        return RequestData, ()  # process-local: a copy in another process starts empty

    def __repr__(self) -> str:
        return f"RequestData({', '.join(map(str, self._values))})"
