"""What the scheduler sees of each API's body: its token view. Every generating API is seen as a
chat request (`messages`), so the prefix plugins, token producers and load estimates read the
Responses API the same way they read chat; the client's own bytes are forwarded unchanged.

Each view checks the fields routing needs (pydantic at the edge) and answers a 400 naming the
parameter otherwise; other fields are the model server's to judge."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from scheduler import LLMRequest
from serve_app.gateway.errors import GatewayError, bad_request

RESPONSES_PATH = "/v1/responses"
MESSAGES_PATH = "/v1/messages"
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"
ANTHROPIC_PATHS = frozenset({MESSAGES_PATH, COUNT_TOKENS_PATH})
# the speech-to-text APIs: a multipart form (serve_app/gateway/form_fields.py), not JSON
FORM_PATHS = frozenset({"/v1/audio/transcriptions", "/v1/audio/translations"})


class ResponsesRequest(BaseModel):
    """The Responses API fields routing reads (`input` items stay free-form: tools and content
    parts are many, and the model server checks them)."""

    model_config = ConfigDict(extra="allow")
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    previous_response_id: str | None = Field(None, min_length=1)


def _content_text(content: Any) -> str:
    """A message's content as text: a string, or its parts' texts (other parts as JSON)."""
    if isinstance(content, list):
        return "".join(str(p.get("text")) if isinstance(p, dict) and "text" in p else json.dumps(p) for p in content)
    return "" if content is None else str(content)


def responses_messages(req: ResponsesRequest) -> list[dict[str, str]]:
    """`instructions` then `input` as chat messages: a string is one user turn, items with a role
    are messages, other items (tool calls and their outputs) are kept as their JSON text."""
    out = [{"role": "system", "content": req.instructions}] if req.instructions else []
    if isinstance(req.input, str):
        return [*out, {"role": "user", "content": req.input}]
    for item in req.input:
        role = item.get("role")
        text = _content_text(item.get("content")) if role else json.dumps(item, separators=(",", ":"))
        out.append({"role": str(role or "user"), "content": text})
    return out


class MessagesRequest(BaseModel):
    """The Anthropic Messages fields routing reads (content blocks stay free-form)."""

    model_config = ConfigDict(extra="allow")
    messages: list[dict[str, Any]] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None


def anthropic_messages(req: MessagesRequest) -> list[dict[str, str]]:
    """`tools`, `system`, then the turns as chat messages, in the order a chat template renders
    them (tools first), so a shared system prompt and tool list make a shared prefix."""
    out = [{"role": "system", "content": json.dumps(req.tools, separators=(",", ":"))}] if req.tools else []
    if req.system:
        out.append({"role": "system", "content": _content_text(req.system)})
    out += [{"role": str(m.get("role", "user")), "content": _content_text(m.get("content"))} for m in req.messages]
    return out


def messages_view(body: dict[str, Any]) -> dict[str, Any]:
    """The Anthropic body with its conversation as chat `messages` (its own `messages` replaced:
    the client's bytes are what the pod gets)."""
    return {**body, "messages": anthropic_messages(_checked(MessagesRequest, body))}


def _checked(model: type[BaseModel], body: dict[str, Any]) -> Any:
    try:
        return model.model_validate(body)
    except ValidationError as err:
        first = err.errors()[0]
        loc = first.get("loc", ())
        param = str(loc[0]) if loc else None  # the body's field; the message says where inside
        where = ".".join(str(p) for p in loc) or "body"
        raise bad_request(f"'{where}': {first.get('msg', 'invalid value')}", param=param) from None


def responses_view(body: dict[str, Any]) -> dict[str, Any]:
    """The Responses body with its conversation as chat `messages`."""
    return {**body, "messages": responses_messages(_checked(ResponsesRequest, body))}


class CompletionsRequest(BaseModel):
    """A completions prompt as vLLM takes it: one string or token list, or a batch of either
    (the prefix plugins read a batch as its prompts joined)."""

    model_config = ConfigDict(extra="allow")
    prompt: str | list[int] | list[str] | list[list[int]] = Field(min_length=1)


def completions_view(body: dict[str, Any]) -> dict[str, Any]:
    if "prompt" not in body:
        raise bad_request("'prompt' is required", param="prompt")
    _checked(CompletionsRequest, body)
    return body


def chat_view(body: dict[str, Any]) -> dict[str, Any]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty list", param="messages")
    return body


PROMPT_FIELDS = frozenset({"prompt", "messages", "input"})


def load_view(*needs: tuple[str, ...]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A view for an API routed by load alone (embeddings, pooling, score, tokenize): each of
    `needs` names fields of which the body must hold one, and the scheduler sees no prompt, so
    no prefix plugin ties these requests to a pod (model and LoRA filters still apply)."""

    def view(body: dict[str, Any]) -> dict[str, Any]:
        for fields in needs:
            if not any(f in body for f in fields):
                named = " or ".join(f"'{f}'" for f in fields)
                raise bad_request(f"{named} is required", param=fields[0])
        return {k: v for k, v in body.items() if k not in PROMPT_FIELDS}

    return view


_AUDIO_FIELDS = load_view(("file",))
_FORM_BOOL = TypeAdapter(bool)


def audio_view(fields: dict[str, Any]) -> dict[str, Any]:
    """A speech-to-text form, routed by load: it must carry its `file`; `stream` is a form's text
    (`true`, `1`, `on`…), read as the pod reads it."""
    view = _AUDIO_FIELDS(fields)
    try:
        return {**view, "stream": _FORM_BOOL.validate_python(view.get("stream", False))}
    except ValidationError:
        raise bad_request(f"'stream' must be a boolean, got {str(view.get('stream'))[:40]!r}", param="stream") from None


EMBEDDING_VIEW = load_view(("input", "messages"))
SCORE_VIEW = load_view(("text_1",), ("text_2",))
RERANK_VIEW = load_view(("query",), ("documents",))
LOAD_VIEWS = {
    "/v1/embeddings": EMBEDDING_VIEW,
    "/pooling": EMBEDDING_VIEW,
    "/classify": load_view(("input",)),
    "/score": SCORE_VIEW,
    "/v1/score": SCORE_VIEW,
    "/rerank": RERANK_VIEW,
    "/v1/rerank": RERANK_VIEW,
    "/v2/rerank": RERANK_VIEW,
    "/tokenize": load_view(("prompt", "messages")),
    "/detokenize": load_view(("tokens",)),
    **dict.fromkeys(FORM_PATHS, audio_view),
}
# path → its view; a path not here is not an inference route of the gateway
VIEWS = {
    "/v1/completions": completions_view,
    "/v1/chat/completions": chat_view,
    RESPONSES_PATH: responses_view,
    MESSAGES_PATH: messages_view,
    COUNT_TOKENS_PATH: load_view(("messages",)),  # by load, as the other APIs that generate nothing
    **LOAD_VIEWS,
}


_JSON_LOAD_PATHS = [p for p in LOAD_VIEWS if p not in FORM_PATHS]
# Every route of the gateway and how it is scheduled: what `epp validate` lists (README, "Routes").
ROUTE_TABLE = (
    ("POST /v1/completions, /v1/chat/completions", "every profile, prefix affinity; the P/D hand-off when configured"),
    ("POST /v1/responses", "as chat (instructions + input items as messages); a previous_response_id: only its pod"),
    ("GET, DELETE /v1/responses/{id}, POST .../cancel", "to the pod that made the response; not scheduled"),
    ("POST /v1/messages", "as chat (tools, system, turns as messages); Anthropic-shaped errors, x-api-key"),
    (f"POST {COUNT_TOKENS_PATH}", "by load; Anthropic-shaped errors, x-api-key"),
    ("POST " + ", ".join(_JSON_LOAD_PATHS), "by load: no prompt for the prefix plugins; model and LoRA filters"),
    ("POST " + ", ".join(sorted(FORM_PATHS)), "by load; the multipart form forwarded whole (model, stream read)"),
    ("GET /v1/models, /health, /ready, /metrics", "answered by the gateway"),
    ("any other path", "404 naming it; never passed to a pod"),
)


def scheduling_view(path: str, body: dict[str, Any]) -> dict[str, Any]:
    view = VIEWS.get(path) or (chat_view if path.endswith("/chat/completions") else completions_view)
    return view(body)


# The fields the views read to make an API's conversation (with `model`, `stream`): with the fields
# the config's plugins declare, all a Serve request router takes out of a pydantic request.
VIEW_INPUT_FIELDS = frozenset({"model", "stream", "messages"}).union(
    ResponsesRequest.model_fields, MessagesRequest.model_fields, CompletionsRequest.model_fields
)


def scheduling_request(
    path: str | None,
    body: dict[str, Any],
    request_id: str,
    model: str,
    headers: dict[str, str] | None = None,
    priority: int = 0,
    lenient: bool = False,
) -> LLMRequest:
    """The scheduler's request for a parsed body of the API at `path`: its view (above) as the body,
    the rest as the door found it. Every front door makes its request here: the HTTP gateway and
    ext_proc through serve_app/gateway/parsing.py, a Serve request router through
    serve_app/llm_router/requests.py. An invalid body raises GatewayError (the gateway answers 400);
    `lenient` schedules it by load instead, without its prompt (a Serve router: the replica answers
    the error). `path` None: a body of no known API, seen as it is."""
    if path is not None:
        try:
            body = scheduling_view(path, body)
        except GatewayError:
            if not lenient:
                raise
            body = {k: v for k, v in body.items() if k not in PROMPT_FIELDS}
    return LLMRequest(request_id, model, body, headers if headers is not None else {}, priority)
