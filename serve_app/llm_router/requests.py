"""The scheduler's request from a Ray Serve pending request: the OpenAI-shaped body among the
handle call's arguments, and the target model (a multiplexed model id is a LoRA adapter)."""

from __future__ import annotations

from typing import Any

from ray.serve.request_router import PendingRequest

from actors.protocol import SCHEDULING_BODY_FIELDS
from scheduler import LLMRequest


def body_of(args: list[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The OpenAI-shaped body among a handle call's arguments: a dict, or a pydantic request such as
    vLLM's ChatCompletionRequest / CompletionRequest (only the fields scheduling reads)."""
    for value in [*args, *kwargs.values()]:
        if isinstance(value, dict) and ("messages" in value or "prompt" in value):
            return value
        dump = getattr(value, "model_dump", None)
        if dump is not None and (hasattr(value, "messages") or hasattr(value, "prompt")):
            try:
                return dump(include=set(SCHEDULING_BODY_FIELDS), exclude_none=True)
            except Exception:  # an odd model: schedule without a body
                return {}
    return {}


def request_of(pending_request: PendingRequest, default_model: str) -> LLMRequest:
    """The scheduler's request: the multiplexed model id (a LoRA adapter) is the target model, else
    the body's model, else `default_model` (the deployment's name)."""
    metadata = pending_request.metadata
    body = body_of(pending_request.args, pending_request.kwargs)
    model = metadata.multiplexed_model_id or body.get("model") or default_model
    return LLMRequest(metadata.internal_request_id, str(model), body)
