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

from typing import Any

from ray.serve.request_router import PendingRequest

from actors.protocol import SCHEDULING_BODY_FIELDS
from scheduler import LLMRequest
from serve_app.gateway.api_views import COUNT_TOKENS_PATH, MESSAGES_PATH, PROMPT_FIELDS, RESPONSES_PATH, scheduling_view
from serve_app.gateway.errors import GatewayError

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
# the fields of a pydantic request that any API's view reads (Responses' and Anthropic's included)
VIEW_FIELDS = {*SCHEDULING_BODY_FIELDS, "input", "instructions", "system", "tools", "previous_response_id"}


def _as_body(value: Any) -> dict[str, Any] | None:
    """A dict, or a pydantic request such as vLLM's ChatCompletionRequest (only the fields the
    views read); None for any other argument."""
    if isinstance(value, dict):
        return value
    dump = getattr(value, "model_dump", None)
    if dump is None:
        return None
    try:
        return dump(include=VIEW_FIELDS, exclude_none=True)
    except Exception:  # an odd model: schedule without a body
        return {}


def body_of(args: list[Any], kwargs: dict[str, Any], call_method: str = "__call__") -> dict[str, Any]:
    """What the scheduler sees of the request's body. For a method of a known API, the first
    body-like argument through that API's view (an invalid body: by load, the replica answers it);
    otherwise the first argument with a `messages` or `prompt`, seen as it is."""
    values = [*args, *kwargs.values()]
    path = METHOD_PATHS.get(call_method)
    if path is not None:
        body = next((b for b in map(_as_body, values) if b is not None), {})
        try:
            return scheduling_view(path, body)
        except GatewayError:
            return {k: v for k, v in body.items() if k not in PROMPT_FIELDS}
    for value in values:
        if isinstance(value, dict) and ("messages" in value or "prompt" in value):
            return value
        if not isinstance(value, dict) and (hasattr(value, "messages") or hasattr(value, "prompt")):
            body = _as_body(value)
            if body is not None:
                return body
    return {}


def request_of(pending_request: PendingRequest, default_model: str) -> LLMRequest:
    """The scheduler's request: the multiplexed model id (a LoRA adapter) is the target model, else
    the body's model, else `default_model` (the deployment's name)."""
    metadata = pending_request.metadata
    body = body_of(pending_request.args, pending_request.kwargs, metadata.call_method)
    model = metadata.multiplexed_model_id or body.get("model") or default_model
    return LLMRequest(metadata.internal_request_id, str(model), body)
