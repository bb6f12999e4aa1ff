"""Session affinity as llm-d keeps it (llm-d/llm-d-router, pkg/epp/framework/plugins/scheduling/
scorer/sessionaffinity and filter/sessionaffinity), shared by `session-affinity-scorer` and
`session-affinity-filter`.

Two algorithms:

* `encoded_endpoint_header` (default, stateless): the response carries `x-session-token:
  <base64 of the endpoint's name>`; a client that echoes it names the endpoint it wants again.
  llm-d encodes the pod's `namespace/name`; our endpoints have just a name.
* `session_id_header` (stateful): the client sends an opaque session id in the header; the plugin
  binds it to the endpoint that served it (at PreRequest), evicts bindings unused for
  `evictionTtlSeconds`, and places an unbound session on the candidate bound by the fewest
  sessions. Nothing is written back. The bindings live with the plugin instance, that is in the
  profile actor, so every gateway replica shares them."""

from __future__ import annotations

import base64
import binascii
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from pydantic import Field, field_validator

from scheduler.interfaces import Parameters
from scheduler.types import Endpoint, LLMRequest, SchedulingResult

SESSION_TOKEN_HEADER = "x-session-token"
ENCODED_ENDPOINT_HEADER = "encoded_endpoint_header"
SESSION_ID_HEADER = "session_id_header"


class SessionAffinityParameters(Parameters):
    algorithm: Literal["encoded_endpoint_header", "session_id_header"] = ENCODED_ENDPOINT_HEADER
    header_name: str = Field(default=SESSION_TOKEN_HEADER, alias="headerName")
    profile_name: str = Field(default="", alias="profileName")
    eviction_ttl_seconds: float = Field(default=600.0, gt=0, alias="evictionTtlSeconds")
    eviction_sweep_seconds: float = Field(default=30.0, gt=0, alias="evictionSweepSeconds")
    miss_threshold: int = Field(default=3, ge=1, alias="missThreshold")

    @field_validator("header_name")
    @classmethod
    def _header(cls, v: str) -> str:
        v = v.strip().lower()
        if not v or any(c.isspace() or c == ":" for c in v):
            raise ValueError(f"{v!r} is not an HTTP header name")
        return v


def session_token_for(endpoint_name: str) -> str:
    """The session token of a response served by this endpoint (base64, standard alphabet, padded)."""
    return base64.b64encode(endpoint_name.encode()).decode("ascii")


def endpoint_of_session_token(token: str) -> str | None:
    """The endpoint name a session token carries, or None when it is empty or not valid base64
    (strict, as Go's base64.StdEncoding: no stray characters, padding required)."""
    if not token:
        return None
    try:
        return base64.b64decode(token, validate=True).decode()
    except (binascii.Error, ValueError):  # bad base64, or bytes that are not UTF-8
        return None


def endpoint_to_write(result: SchedulingResult, profile_name: str) -> Endpoint | None:
    """The endpoint a session is tied to: the target of `profile_name` (e.g. `prefill`, for a
    second instance that pins prefill), else of the primary profile; None when that profile did
    not run or failed."""
    run = result.profile_results.get(profile_name or result.primary_profile_name)
    if run is None or not run.target_endpoints:
        return None
    return run.target_endpoints[0]


@dataclass(slots=True)
class _Binding:
    endpoint: str
    last_used: float
    misses: int = 0  # consecutive requests whose candidates lacked `endpoint`


class SessionBindings:
    """session id -> endpoint, TTL-evicted, with the count of sessions per endpoint (the
    `session_id_header` algorithm). A binding follows the endpoint that served the session's
    last request, except while its endpoint is missing from the candidates (draining, stale,
    filtered out): it stays until that happened `miss_threshold` times in a row, the requests
    meanwhile placed as an unbound one would be."""

    __slots__ = ("_bindings", "_clock", "_counts", "_cursor", "_last_sweep", "miss_threshold", "sweep_s", "ttl_s")

    def __init__(
        self, ttl_s: float, sweep_s: float, miss_threshold: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._clock = clock
        self.ttl_s = ttl_s
        self.sweep_s = sweep_s
        self.miss_threshold = miss_threshold
        self._bindings: dict[str, _Binding] = {}
        self._counts: dict[str, int] = {}
        self._cursor = 0
        self._last_sweep = clock()

    def __len__(self) -> int:
        return len(self._bindings)

    def bound(self, session_id: str) -> str | None:
        b = self._bindings.get(session_id)
        return None if b is None else b.endpoint

    def choose(self, session_id: str, endpoints: list[Endpoint], place_unbound: bool) -> Endpoint | None:
        """The candidate this session is bound to; else, with `place_unbound`, the candidate bound
        by the fewest sessions (None without it)."""
        if not endpoints:
            return None
        b = self._bindings.get(session_id)
        if b is not None:
            for ep in endpoints:
                if ep.name == b.endpoint:
                    b.misses = 0
                    return ep
            b.misses += 1
        return self._least_bound(endpoints) if place_unbound else None

    def bind(self, session_id: str, endpoint: str) -> None:
        """After the decision: tie the session to the endpoint that serves it (a bound session
        moves only once its endpoint was missing `miss_threshold` times in a row)."""
        now = self._clock()
        self._sweep(now)
        b = self._bindings.get(session_id)
        if b is None:
            self._bindings[session_id] = _Binding(endpoint, now)
            self._counts[endpoint] = self._counts.get(endpoint, 0) + 1
            return
        b.last_used = now
        if b.endpoint == endpoint:
            return
        if 0 < b.misses < self.miss_threshold:  # its endpoint is away for now: keep the pin
            return
        # Its endpoint was there and other scorers outweighed it (the conversation's newest cache
        # is now where this request went), or it was away `miss_threshold` times: move.
        self._release(b.endpoint)
        b.endpoint, b.misses = endpoint, 0
        self._counts[endpoint] = self._counts.get(endpoint, 0) + 1

    def _least_bound(self, endpoints: list[Endpoint]) -> Endpoint:
        least = min(self._counts.get(ep.name, 0) for ep in endpoints)
        tied = sorted((ep for ep in endpoints if self._counts.get(ep.name, 0) == least), key=lambda ep: ep.name)
        self._cursor += 1  # spread new sessions round-robin over equally bound endpoints
        return tied[self._cursor % len(tied)]

    def _release(self, endpoint: str) -> None:
        left = self._counts.get(endpoint, 0) - 1
        if left > 0:
            self._counts[endpoint] = left
        else:
            self._counts.pop(endpoint, None)

    def _sweep(self, now: float) -> None:
        if now - self._last_sweep < self.sweep_s:
            return
        self._last_sweep = now
        expired = [sid for sid, b in self._bindings.items() if now - b.last_used > self.ttl_s]
        for sid in expired:
            self._release(self._bindings.pop(sid).endpoint)


class SessionAffinity:
    """One plugin instance's session logic, whichever algorithm its parameters name."""

    __slots__ = ("bindings", "header", "params", "place_unbound")

    def __init__(self, params: SessionAffinityParameters, place_unbound: bool) -> None:
        self.params = params
        self.place_unbound = place_unbound  # the scorer steers new sessions; the filter only pins
        self.header = params.header_name
        self.bindings = (
            SessionBindings(params.eviction_ttl_seconds, params.eviction_sweep_seconds, params.miss_threshold)
            if params.algorithm == SESSION_ID_HEADER
            else None
        )

    def preferred(self, request: LLMRequest, endpoints: list[Endpoint]) -> Endpoint | None:
        """The candidate this request's session points at, or None (no session, a token that names
        no candidate)."""
        value = request.header(self.header)
        if not value:
            return None
        if self.bindings is not None:
            return self.bindings.choose(value, endpoints, self.place_unbound)
        name = endpoint_of_session_token(value)
        return next((ep for ep in endpoints if ep.name == name), None)

    def record(self, request: LLMRequest, result: SchedulingResult) -> None:
        if self.bindings is None:
            return
        session_id = request.header(self.header)
        target = endpoint_to_write(result, self.params.profile_name)
        if session_id and target is not None:
            self.bindings.bind(session_id, target.name)

    def response_headers(self, result: SchedulingResult) -> dict[str, str]:
        if self.bindings is not None:  # the client owns its session id
            return {}
        target = endpoint_to_write(result, self.params.profile_name)
        return {} if target is None else {self.header: session_token_for(target.name)}
