"""The data the scheduler works on: endpoints with their metrics, requests, and results.

Slotted dataclasses: they are built and read on every request. `Metrics`, `Endpoint` and
`LLMRequest` are the public API's input: each checks its fields where they enter (scheduler/
input_coercion.py), converting a value of another usable type (a list of model names, a mapping for
labels) and raising TypeError / ValueError for the rest, at the cost of a type check per field."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from scheduler.data_keys import DataKey, RequestData
from scheduler.errors import ErrorCode, SchedulingError
from scheduler.input_coercion import (
    model_counts,
    names,
    plain_dict,
    real_number,
    text,
    text_map,
    whole_number,
)

_METRIC_COUNTS = (
    "waiting_queue_size", "running_requests_size", "max_active_models", "cache_block_size", "cache_num_blocks",
)  # fmt: skip
_METRIC_REALS = ("kv_cache_usage_percent", "update_time", "reported_at")


@dataclass(slots=True)
class Metrics:
    """A model server's state as the last scrape saw it (GIE's datalayer Metrics).

    `active_models` / `waiting_models` map adapter names to counts; any iterable of names is
    accepted too (each counted 0)."""

    waiting_queue_size: int = 0
    running_requests_size: int = 0
    kv_cache_usage_percent: float = 0.0
    active_models: dict[str, int] = field(default_factory=dict)
    waiting_models: dict[str, int] = field(default_factory=dict)
    max_active_models: int = 0
    cache_block_size: int = 0
    cache_num_blocks: int = 0
    update_time: float = 0.0
    # When the metrics were reported, kept by a consumer that zeroes `update_time` because freshness
    # was judged upstream (actors/protocol.py `as_served`): what "sent after the last report" is
    # measured against (lora-residency-scorer). Not sent anywhere; 0: use `update_time`.
    reported_at: float = 0.0

    def __post_init__(self) -> None:
        if type(self.active_models) is not dict:
            self.active_models = model_counts("Metrics.active_models", self.active_models)
        if type(self.waiting_models) is not dict:
            self.waiting_models = model_counts("Metrics.waiting_models", self.waiting_models)
        for name in _METRIC_COUNTS:
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                setattr(self, name, whole_number(f"Metrics.{name}", value))
        for name in _METRIC_REALS:
            value = getattr(self, name)
            if type(value) is not float or not value >= 0.0:  # also catches NaN
                setattr(self, name, real_number(f"Metrics.{name}", value))

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Metrics:
        return cls(
            waiting_queue_size=int(data.get("waiting_queue_size", 0)),
            running_requests_size=int(data.get("running_requests_size", 0)),
            kv_cache_usage_percent=float(data.get("kv_cache_usage_percent", 0.0)),
            active_models=data.get("active_models"),  # type: ignore[arg-type]  (normalised on entry)
            waiting_models=data.get("waiting_models"),  # type: ignore[arg-type]
            max_active_models=int(data.get("max_active_models", 0)),
            cache_block_size=int(data.get("cache_block_size", 0)),
            cache_num_blocks=int(data.get("cache_num_blocks", data.get("cache_num_gpu_blocks", 0))),
            update_time=float(data.get("update_time", 0.0)),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "waiting_queue_size": self.waiting_queue_size,
            "running_requests_size": self.running_requests_size,
            "kv_cache_usage_percent": self.kv_cache_usage_percent,
            "active_models": sorted(self.active_models),
            "waiting_models": sorted(self.waiting_models),
            "max_active_models": self.max_active_models,
            "cache_block_size": self.cache_block_size,
            "cache_num_blocks": self.cache_num_blocks,
            "update_time": self.update_time,
        }


@dataclass(slots=True, frozen=True)
class ServedModel:
    """One entry of a model server's OpenAI `/v1/models` list: a base model, or a LoRA adapter
    (`parent` names its base model, as vLLM reports it). `created` is not compared: vLLM stamps
    every answer with the time of the call."""

    id: str
    parent: str = ""
    owned_by: str = ""
    object: str = "model"
    created: int = field(default=0, compare=False)
    shutdown_date: str = ""

    @property
    def is_adapter(self) -> bool:
        return bool(self.parent)

    def __reduce__(self) -> tuple:
        # Snapshots carry every pod's list to every reader: pickled as its fields, not a slot state
        # (about 3x fewer bytes and CPU than a frozen dataclass's default).
        return ServedModel, (self.id, self.parent, self.owned_by, self.object, self.created, self.shutdown_date)

    @classmethod
    def from_json(cls, data: Any) -> ServedModel:
        """An entry of a `/v1/models` answer (or a bare id); ValueError when it has no string id."""
        if isinstance(data, str) and data:
            return cls(data)
        if not isinstance(data, dict) or not isinstance(data.get("id"), str) or not data["id"]:
            raise ValueError(f"a served model needs a string 'id': {data!r}")

        def field_text(key: str) -> str:  # interned: pods list the same names, pickled once per snapshot
            value = data.get(key)
            return sys.intern(value) if isinstance(value, str) else ""

        created = data.get("created")
        return cls(
            sys.intern(data["id"]),
            field_text("parent"),
            field_text("owned_by"),
            field_text("object") or "model",
            created if type(created) is int and created >= 0 else 0,
            field_text("shutdown_date"),
        )

    def to_json(self) -> dict[str, Any]:
        """The OpenAI model object: id and object always, the other fields when the server gave them."""
        out: dict[str, Any] = {"id": self.id, "object": self.object}
        if self.created:
            out["created"] = self.created
        for key in ("owned_by", "parent", "shutdown_date"):
            if value := getattr(self, key):
                out[key] = value
        return out


@dataclass(slots=True, eq=False)
class Endpoint:
    """A model server. Hashed by identity: within one cycle every plugin sees the same objects.

    `attributes` holds request-scoped data plugins attach to an endpoint (e.g. its prefix-cache
    match), copied into the profile result for the chosen targets so that other profiles and the
    profile handler can read it even when the profile ran in another process.

    `served_models` is the server's own `/v1/models` list as last collected, None while it has not
    been (or for an endpoint that does not come from the datastore)."""

    name: str
    address: str = "127.0.0.1"
    port: int = 8000
    labels: dict[str, str] = field(default_factory=dict)
    metrics: Metrics = field(default_factory=Metrics)
    attributes: dict[str, Any] = field(default_factory=dict)
    served_models: tuple[ServedModel, ...] | None = None

    def __post_init__(self) -> None:
        if self.served_models is not None and type(self.served_models) is not tuple:
            if not isinstance(self.served_models, list | tuple):
                raise TypeError(f"Endpoint.served_models must be a list of models, got {self.served_models!r}")
            self.served_models = tuple(
                m if isinstance(m, ServedModel) else ServedModel.from_json(m) for m in self.served_models
            )
        if type(self.name) is not str or not self.name:
            self.name = text("Endpoint.name", self.name, empty=False)
        if type(self.address) is not str:
            self.address = text("Endpoint.address", self.address)
        if type(self.port) is not int or not 0 < self.port < 65536:
            self.port = whole_number("Endpoint.port", self.port, minimum=1)
            if self.port > 65535:
                raise ValueError(f"Endpoint.port must be <= 65535, got {self.port}")
        if type(self.labels) is not dict:
            self.labels = text_map("Endpoint.labels", self.labels)
        if type(self.metrics) is not Metrics and not isinstance(self.metrics, Metrics):
            if not isinstance(self.metrics, Mapping):
                raise TypeError(f"Endpoint.metrics must be a Metrics (or its JSON form), got {self.metrics!r}")
            self.metrics = Metrics.from_json(dict(self.metrics))
        if type(self.attributes) is not dict:
            self.attributes = plain_dict("Endpoint.attributes", self.attributes)

    @property
    def host_port(self) -> str:
        return f"{self.address}:{self.port}"

    def with_attributes(self, attributes: dict[str, Any]) -> Endpoint:
        return replace(self, attributes=dict(attributes))

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Endpoint:
        if not isinstance(data, dict) or not data.get("name"):
            raise ValueError(f"an endpoint needs a 'name': {data!r}")
        return cls(
            name=str(data["name"]),
            address=str(data.get("address", "127.0.0.1")),
            port=int(data.get("port", 8000)),
            labels={str(k): str(v) for k, v in (data.get("labels") or {}).items()},
            metrics=Metrics.from_json(data.get("metrics") or {}),
            served_models=data.get("served_models"),
        )

    def to_json(self) -> dict[str, Any]:
        out = {
            "name": self.name,
            "address": self.address,
            "port": self.port,
            "labels": dict(self.labels),
            "metrics": self.metrics.to_json(),
        }
        if self.served_models is not None:
            out["served_models"] = [m.to_json() for m in self.served_models]
        return out

    def __repr__(self) -> str:
        return f"Endpoint({self.name})"


PROMPT_TEXT: DataKey[str] = DataKey("prompt-text")  # LLMRequest.prompt_text(), once per request

_CRITICALITY_PRIORITY = {"Critical": 1, "Standard": 0, "Sheddable": -1}


@dataclass(slots=True, eq=False)
class LLMRequest:
    """One inference request as the scheduler sees it.

    `priority < 0` marks a sheddable request. `derived` holds values derived from the request
    (prompt text, tokens, prefix block hashes, what a plugin learned of it) under typed keys, so
    each is computed once per request per process; it never travels to another process."""

    request_id: str
    target_model: str
    body: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    priority: int = 0
    received_at: float = field(default_factory=time.monotonic)
    # Endpoints this request must not go to (e.g. one that just failed it, when retrying).
    excluded_endpoints: frozenset[str] = frozenset()
    derived: RequestData = field(default_factory=RequestData, compare=False, repr=False)

    def __post_init__(self) -> None:
        if type(self.request_id) is not str:
            self.request_id = text("LLMRequest.request_id", self.request_id)
        if type(self.target_model) is not str or not self.target_model:
            self.target_model = text("LLMRequest.target_model", self.target_model, empty=False)
        if type(self.body) is not dict:
            self.body = plain_dict("LLMRequest.body", self.body)
        if type(self.headers) is not dict:
            self.headers = text_map("LLMRequest.headers", self.headers)
        if type(self.priority) is not int:
            self.priority = whole_number("LLMRequest.priority", self.priority, minimum=None)
        if type(self.received_at) is not float:
            self.received_at = real_number("LLMRequest.received_at", self.received_at, minimum=None)
        if type(self.excluded_endpoints) is not frozenset:
            self.excluded_endpoints = names("LLMRequest.excluded_endpoints", self.excluded_endpoints)
        if type(self.derived) is not RequestData:
            raise TypeError(f"LLMRequest.derived must be a RequestData, got {type(self.derived).__name__}")

    @property
    def sheddable(self) -> bool:
        return self.priority < 0

    def with_body_fields(self, fields: Collection[str]) -> LLMRequest:
        """The request's identity (id, model, headers, priority, exclusions) with only `fields` of
        its body (those it has) and no derived data: what crosses to a profile actor, where plugins read
        only the fields they declare (scheduler/body_fields.py)."""
        body = self.body
        return LLMRequest(
            self.request_id, self.target_model, {k: body[k] for k in fields if k in body}, self.headers,
            self.priority, self.received_at, self.excluded_endpoints,
        )  # fmt: skip

    def without_body(self) -> LLMRequest:
        """The request without its body: what a response event needs, at a fraction of the bytes."""
        return self.with_body_fields(())

    @property
    def critical(self) -> bool:
        return self.priority > 0

    def prompt_text(self) -> str:
        """The user input as GIE's prefix plugin reads it: the completion prompt, or the chat
        messages serialised as JSON."""
        text = self.derived.get(PROMPT_TEXT)
        if text is None:
            text = prompt_text_of(self.body)
            self.derived.put(PROMPT_TEXT, text)
        return text

    def cache_salt(self) -> str:
        salt = self.body.get("cache_salt")
        return salt if isinstance(salt, str) else ""

    def header(self, name: str, default: str = "") -> str:
        """A header by case-insensitive name."""
        lname = name.lower()
        for key, value in self.headers.items():
            if key.lower() == lname:
                return value
        return default

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LLMRequest:
        """The JSON form of DESIGN.md; a body's `model` stands in for a missing target_model."""
        if not isinstance(data, dict):
            raise SchedulingError(ErrorCode.BAD_REQUEST, "a request must be a JSON object")
        body = data.get("body") or {}
        if not isinstance(body, dict):
            raise SchedulingError(ErrorCode.BAD_REQUEST, "'body' must be a JSON object")
        target = data.get("target_model") or body.get("model")
        if not target or not isinstance(target, str):
            raise SchedulingError(ErrorCode.BAD_REQUEST, "the request names no model ('target_model' or body.model)")
        return cls(
            request_id=str(data.get("request_id") or "request"),
            target_model=target,
            body=body,
            headers={str(k): str(v) for k, v in (data.get("headers") or {}).items()},
            priority=parse_priority(data.get("priority"), data.get("criticality")),
        )


def parse_priority(priority: Any, criticality: Any = None) -> int:
    """An integer priority, or one derived from GIE's older criticality names."""
    if priority is not None:
        try:
            return int(priority)
        except (TypeError, ValueError):
            raise SchedulingError(ErrorCode.BAD_REQUEST, f"priority must be an integer, got {priority!r}") from None
    if criticality is not None:
        if criticality not in _CRITICALITY_PRIORITY:
            raise SchedulingError(
                ErrorCode.BAD_REQUEST,
                f"criticality must be one of {sorted(_CRITICALITY_PRIORITY)}, got {criticality!r}",
            )
        return _CRITICALITY_PRIORITY[criticality]
    return 0


def prompt_text_of(body: dict[str, Any]) -> str:
    """The text a prefix cache would key on, for completions and chat completions bodies."""
    if "messages" in body:
        return json.dumps(body["messages"], separators=(",", ":"), ensure_ascii=False)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        return "".join(p if isinstance(p, str) else json.dumps(p) for p in prompt)
    return ""


@dataclass(slots=True)
class ScoredEndpoint:
    endpoint: Endpoint
    score: float


@dataclass(slots=True)
class ProfileRunResult:
    """What one profile picked. Targets carry the attributes plugins attached to them."""

    target_endpoints: list[Endpoint]


@dataclass(slots=True)
class SchedulingResult:
    """The result of all profiles; a profile that ran and failed maps to None (GIE PR #1013:
    the entry stays, with no result).

    `prefill_profile_name` names the profile whose target runs the prompt's prefill in P/D (set by
    the disagg handler, whose profile names are configurable); None means no prefill stage, and
    consumers then fall back to GIE's convention, a profile named "prefill"."""

    profile_results: dict[str, ProfileRunResult | None]
    primary_profile_name: str
    prefill_profile_name: str | None = None

    @property
    def primary(self) -> ProfileRunResult:
        result = self.profile_results.get(self.primary_profile_name)
        if result is None:
            raise SchedulingError(ErrorCode.INTERNAL, f"primary profile {self.primary_profile_name!r} has no result")
        return result

    @property
    def target(self) -> Endpoint:
        return self.primary.target_endpoints[0]

    def to_json(self) -> dict[str, Any]:
        return {
            "primary_profile": self.primary_profile_name,
            "profiles": {
                name: None if r is None else [e.name for e in r.target_endpoints]
                for name, r in self.profile_results.items()
            },
        }
