"""Per-request scratch space shared by the plugins of one scheduling request (GIE's CycleState)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar, overload

from scheduler.data_keys import DataKey
from scheduler.errors import ErrorCode, SchedulingError

# Where a filter that removes every endpoint on purpose (e.g. a drop for sheddable requests) puts
# the SchedulingError that explains it; the profile raises it instead of "no endpoints available".
FILTER_FAILURE_KEY = "scheduler/filter-failure"


# The profile whose producers are running (SchedulerProfile.run writes it before them): a producer
# that keeps something per profile (the prefix producer's match, for its metrics) reads it.
RUNNING_PROFILE: DataKey[str] = DataKey("scheduler/running-profile")

T = TypeVar("T")
D = TypeVar("D")


def _attribute_name(key: str | DataKey[Any]) -> str:
    """Endpoint attributes are keyed by the data's name alone: whichever producer wrote it."""
    return key if isinstance(key, str) else key.name


def profile_error_key(profile_name: str) -> str:
    """Where the loop keeps why a profile failed, for the profile handler to read."""
    return f"scheduler/profile-error/{profile_name}"


class CycleState:
    """Key-value data plugins write during a request's cycles: producers write typed keys (`put`)
    that filters and scorers read (`get`); the loop and handlers keep a few string keys of their own.

    In the Ray path a profile runs in another process on a copy, so what a profile must tell the
    handler or another profile travels on its result's target endpoints, not here."""

    __slots__ = ("_data", "_endpoint_attributes")

    def __init__(self) -> None:
        self._data: dict[str | DataKey[Any], Any] = {}
        # key → {endpoint name → value}: tagging every candidate fills one dict, not one per endpoint.
        self._endpoint_attributes: dict[str, dict[str, Any]] = {}

    def set_endpoint_attribute(self, endpoint_name: str, key: str | DataKey[Any], value: Any) -> None:
        """Attach request-scoped data to an endpoint; the profile copies it onto its chosen targets
        (under the key's name: `endpoint.attributes[KEY.name]`)."""
        name = _attribute_name(key)
        values = self._endpoint_attributes.get(name)
        if values is None:
            values = self._endpoint_attributes[name] = {}
        values[endpoint_name] = value

    def set_endpoint_attributes(self, key: str | DataKey[Any], values: Mapping[str, Any]) -> None:
        """`set_endpoint_attribute` for many endpoints at once: `values` maps endpoint names to values."""
        name = _attribute_name(key)
        existing = self._endpoint_attributes.get(name)
        if existing is None:
            self._endpoint_attributes[name] = dict(values)
        else:
            existing.update(values)

    def attribute_by_endpoint(self, key: str | DataKey[Any]) -> Mapping[str, Any]:
        """One key's values per endpoint name (read-only view; empty when no plugin set the key)."""
        return self._endpoint_attributes.get(_attribute_name(key), {})

    @overload
    def get(self, key: DataKey[T]) -> T | None: ...
    @overload
    def get(self, key: DataKey[T], default: D) -> T | D: ...
    def get(self, key: DataKey[Any], default: Any = None) -> Any:
        """What the key's producer wrote in this cycle (`default` when it wrote nothing)."""
        return self._data.get(key, default)

    def put(self, key: DataKey[T], value: T) -> None:
        self._data[key] = value

    def endpoint_attributes(self, endpoint_name: str) -> dict[str, Any]:
        """What plugins attached to an endpoint (a new dict)."""
        name = endpoint_name
        return {key: by_name[name] for key, by_name in self._endpoint_attributes.items() if name in by_name}

    def read(self, key: str, default: Any = None) -> Any:
        return self._data.get(key, default)

    def write(self, key: str, value: Any) -> None:
        self._data[key] = value

    def delete(self, key: str | DataKey[Any]) -> None:
        self._data.pop(key, None)

    def __contains__(self, key: str | DataKey[Any]) -> bool:
        return key in self._data

    def __getstate__(self) -> tuple[dict[str | DataKey[Any], Any], dict[str, dict[str, Any]]]:
        return self._data, self._endpoint_attributes

    def __setstate__(self, state: tuple[dict[str | DataKey[Any], Any], dict[str, dict[str, Any]]]) -> None:
        self._data, self._endpoint_attributes = state


def profile_failure(cycle_state: CycleState, name: str) -> SchedulingError:
    """The error a failed profile fails the request with: the filter's own code when it gave one
    (e.g. ResourceExhausted for a drop), else ResourceExhausted as GIE's director answers."""
    cause = cycle_state.read(profile_error_key(name))
    if isinstance(cause, SchedulingError) and cause.code is not ErrorCode.INTERNAL:
        return cause
    detail = f": {cause.message}" if isinstance(cause, SchedulingError) else ""
    return SchedulingError(ErrorCode.RESOURCE_EXHAUSTED, f"failed to run scheduler profile '{name}'{detail}")
