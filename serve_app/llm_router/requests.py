"""The scheduler's request from a Ray Serve pending request: the OpenAI-shaped body among the
handle call's arguments, seen as the gateway sees that API (serve_app/gateway/api_views.py), and the target
model (a multiplexed model id is a LoRA adapter).

Which API a request is comes from the handle method it calls (`call_method`): Ray Serve LLM's
`LLMServer` serves chat, completions, embeddings, score, transcriptions, tokenize and detokenize;
a deployment of one's own may name methods `responses` or `messages` too. Chat and completions
(and Responses and Anthropic Messages, as chat) give the prefix plugins their prompt; the others
are routed by load and by the model / LoRA filters, as on the gateway, so an embeddings input or a
tokenize call never draws later requests to a replica nor teaches the prefix index."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from ray.serve.request_router import PendingRequest

from scheduler import LLMRequest
from serve_app.gateway.api_views import (
    COUNT_TOKENS_PATH,
    MESSAGES_PATH,
    RESPONSES_PATH,
    VIEW_INPUT_FIELDS,
    scheduling_request,
)

# handle method → the API it serves (its route on Ray Serve LLM's OpenAI ingress)
METHOD_PATHS = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "responses": RESPONSES_PATH,
    "messages": MESSAGES_PATH,
    "count_tokens": COUNT_TOKENS_PATH,
    "embeddings": "/v1/embeddings",
    "score": "/v1/score",
    "transcriptions": "/v1/audio/transcriptions",
    "translations": "/v1/audio/translations",
    "tokenize": "/tokenize",
    "detokenize": "/detokenize",
}


def _as_body(value: Any, fields: Collection[str]) -> dict[str, Any] | None:
    """A dict, or a pydantic request such as vLLM's ChatCompletionRequest (only the fields the views
    and the plugins read); None for any other argument."""
    if isinstance(value, dict):
        return value
    dump = getattr(value, "model_dump", None)
    if dump is None:
        return None
    try:
        return dump(include=VIEW_INPUT_FIELDS | set(fields), exclude_none=True)
    except Exception:  # an odd model: schedule without a body
        return {}


def api_body(
    args: list[Any], kwargs: dict[str, Any], call_method: str = "__call__", body_fields: Collection[str] = ()
) -> tuple[str | None, dict[str, Any]]:
    """The API the call serves (its gateway path; None for a method of no known API) and its body:
    for a known API the first body-like argument, otherwise the first with a `messages` or
    `prompt`, as it is. `body_fields`: what the config's plugins read of a pydantic request."""
    values = [*args, *kwargs.values()]
    path = METHOD_PATHS.get(call_method)
    if path is not None:
        return path, next((b for b in (_as_body(v, body_fields) for v in values) if b is not None), {})
    for value in values:
        if isinstance(value, dict) and ("messages" in value or "prompt" in value):
            return None, value
        if not isinstance(value, dict) and (hasattr(value, "messages") or hasattr(value, "prompt")):
            body = _as_body(value, body_fields)
            if body is not None:
                return None, body
    return None, {}


def request_of(pending_request: PendingRequest, default_model: str, body_fields: Collection[str] = ()) -> LLMRequest:
    """The scheduler's request, made as the gateway makes it (`scheduling_request`), its body
    through its API's view; an invalid body is routed by load (the replica answers it). The target
    model is the multiplexed model id (a LoRA adapter), else the body's model, else
    `default_model` (the deployment's name)."""
    metadata = pending_request.metadata
    path, body = api_body(pending_request.args, pending_request.kwargs, metadata.call_method, body_fields)
    model = metadata.multiplexed_model_id or body.get("model") or default_model
    return scheduling_request(path, body, metadata.internal_request_id, str(model), lenient=True)
