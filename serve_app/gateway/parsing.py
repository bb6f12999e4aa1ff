"""From an HTTP request to an LLMRequest: JSON checks, routing-header hygiene, priority."""

from __future__ import annotations

import itertools
import json
import os
from dataclasses import dataclass
from typing import Any

from scheduler import LLMRequest, SchedulingError
from scheduler.plugins.support.slo import parse_slo_headers
from serve_app.gateway.api_views import FORM_PATHS, scheduling_request
from serve_app.gateway.errors import GatewayError, bad_request
from serve_app.gateway.form_fields import form_fields
from serve_app.gateway.settings import GatewaySettings

OBJECTIVE_HEADER = "x-gateway-inference-objective"
PRIORITY_HEADER = "x-gateway-inference-priority"
REQUEST_ID_HEADER = "x-request-id"
# Headers that steer routing downstream; a client must never set them (they are ours to set).
ROUTING_HEADERS = frozenset({"x-prefiller-host-port", "x-gateway-destination-endpoint", "x-epp-destination"})
# Hop-by-hop and length headers are never copied between connections.
HOP_HEADERS = frozenset(
    {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "upgrade", "te", "trailer"}
)

_ids = itertools.count()
_id_prefix = f"epp-{os.getpid():x}-"


@dataclass(slots=True)
class ParsedRequest:
    llm_request: LLMRequest
    stream: bool
    forward_headers: dict[str, str]


def parse_request(
    raw: bytes, headers: dict[str, str], path: str, settings: GatewaySettings, known_models: set[str] | None
) -> ParsedRequest:
    """Validate a body of an inference API (`path`, serve_app/gateway/api_views.py); raises GatewayError
    with the status to answer."""
    if len(raw) > settings.max_body_bytes:
        raise GatewayError(413, f"request body of {len(raw)} bytes exceeds the limit of {settings.max_body_bytes}")
    if path in FORM_PATHS:
        body = form_fields(raw, next((v for k, v in headers.items() if k.lower() == "content-type"), ""))
    else:
        body = json_body(raw, settings)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("'model' is required and must be a string", param="model")
    clean = forward_headers(headers)
    request_id = clean[REQUEST_ID_HEADER] = clean.get(REQUEST_ID_HEADER) or f"{_id_prefix}{next(_ids)}"
    llm_request = scheduling_request(path, body, request_id, model, clean)
    stream = llm_request.body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad_request("'stream' must be a boolean", param="stream")
    if known_models is not None and model not in known_models:
        raise GatewayError(404, f"The model `{model}` does not exist.", code="model_not_found", param="model")
    try:  # llm-d's SLO headers, checked here so a malformed one is a 400 before any scheduling
        parse_slo_headers(clean)
    except SchedulingError as err:
        raise bad_request(err.message) from None
    llm_request.priority = priority_of(clean, settings)
    return ParsedRequest(llm_request, stream, clean)


def json_body(raw: bytes, settings: GatewaySettings) -> dict[str, Any]:
    try:
        body: Any = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise bad_request(f"request body is not valid JSON: {err}") from None
    except RecursionError:  # the C parser stops at the interpreter's recursion limit (~1,000 deep)
        raise too_deep(settings.max_json_depth) from None
    if json_depth_over(raw, body, settings.max_json_depth):
        raise too_deep(settings.max_json_depth)
    if not isinstance(body, dict):
        raise bad_request("request body must be a JSON object")
    return body


def forward_headers(headers: dict[str, str]) -> dict[str, str]:
    """A client's headers as they may go on to a model server: lower-cased, without routing or
    hop-by-hop headers."""
    clean = {k.lower(): v for k, v in headers.items()}
    for name in ROUTING_HEADERS | HOP_HEADERS:
        clean.pop(name, None)
    return clean


def too_deep(limit: int) -> GatewayError:
    return bad_request(f"request body nests JSON deeper than the limit of {limit}")


def json_depth_over(raw: bytes, value: Any, limit: int) -> bool:
    """Whether `value` (parsed from `raw`) nests lists / objects more than `limit` deep. No
    recursion, and no walk at all for the usual body: fewer brackets than the limit in the raw
    text means it can not be that deep."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    stack: list[tuple[Any, int]] = [(value, 1)]
    containers = (list, dict)
    while stack:
        node, depth = stack.pop()
        children = node.values() if type(node) is dict else node
        for child in children:
            if isinstance(child, containers):
                if depth >= limit:
                    return True
                stack.append((child, depth + 1))
    return False


def priority_of(headers: dict[str, str], settings: GatewaySettings) -> int:
    """The priority from the objective header (through settings.objectives) or the priority header."""
    objective = headers.get(OBJECTIVE_HEADER)
    if objective:
        if objective not in settings.objectives:
            raise bad_request(f"unknown inference objective {objective!r}", param=OBJECTIVE_HEADER)
        return settings.objectives[objective]
    raw = headers.get(PRIORITY_HEADER)
    if raw is None:
        return 0
    try:
        priority = int(raw)
    except ValueError:
        raise bad_request(f"{PRIORITY_HEADER} must be an integer, got {raw!r}", param=PRIORITY_HEADER) from None
    low, high = settings.priority_range
    if not low <= priority <= high:
        raise bad_request(f"{PRIORITY_HEADER} must lie in [{low}, {high}], got {priority}", param=PRIORITY_HEADER)
    return priority
