"""OpenAI request bodies as vLLM accepts them, and OpenAI-shaped errors.

Unknown keys are ignored (routers add their own); known keys are type-checked, and a wrong type is
a 400 that names the parameter.
"""

from __future__ import annotations

from itertools import accumulate
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    kv_transfer_params: dict[str, Any] | None = None
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    n: int = Field(1, ge=1, le=128, description="choices per prompt")
    seed: int | None = None
    priority: int = 0

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionBody(_Body):
    prompt: str | list[int] | list[str] | list[list[int]] = Field(min_length=1)
    logprobs: int | None = Field(None, ge=0, le=20)
    best_of: int | None = Field(None, ge=1)


def completion_logprobs(text: str, top: int | None, offset: int = 0) -> dict[str, Any] | None:
    """vLLM's completions `logprobs` for `text` (the simulator's words, one token each): each
    token's logprob and its `top` alternatives; None when the request asked for none."""
    if top is None:
        return None
    tokens = [" " + w for w in text.split()]
    offsets = [offset + at - len(t) for t, at in zip(tokens, accumulate(len(t) for t in tokens), strict=True)]
    chosen = [-0.25 * (1 + len(t) % 3) for t in tokens]
    alternatives = [{t: lp, **{f" alt{j}": lp - j - 1 for j in range(max(0, top - 1))}} if top else {}
                    for t, lp in zip(tokens, chosen, strict=True)]  # fmt: skip
    return {"text_offset": offsets, "token_logprobs": chosen, "tokens": tokens, "top_logprobs": alternatives}


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatBody(_Body):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)


class LoraLoadBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    lora_name: str = Field(min_length=1)
    lora_path: str | None = None


ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 429: "RateLimitError",
               500: "InternalServerError", 503: "ServiceUnavailableError"}  # fmt: skip


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    """`{"error": {"message", "type", "param", "code"}}` with vLLM's type names and numeric code."""
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "APIError"), "param": param,
                      "code": status}}  # fmt: skip


def validation_error(exc: ValidationError) -> tuple[str, str | None]:
    """(message, param) for the first problem pydantic found."""
    first = exc.errors()[0]
    loc = first.get("loc", ())
    param = ".".join(str(p) for p in loc) or None
    return f"{param}: {first.get('msg', 'invalid value')}" if param else str(first.get("msg")), param
