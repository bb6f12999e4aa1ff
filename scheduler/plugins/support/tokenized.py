"""Where a request's prompt tokens (as the engine sees them) are kept once a `token-producer` has
made them: the request's derived data (`LLMRequest.derived`), so every plugin of one process
tokenizes a prompt once. Consumers (the precise prefix producer) ask through `TokenSource`, which
the token producer implements. Beside them, the token cache's `TokenRun` they came from, when they
did (its `ids` are the very list kept), where a consumer keeps what it derives from a hot prefix's
tokens."""

from __future__ import annotations

from typing import Protocol

from scheduler.data_keys import DataKey
from scheduler.plugins.support.token_cache import TokenRun
from scheduler.types import LLMRequest

PROMPT_TOKENS: DataKey[list[int]] = DataKey("tokenized-prompt")
PROMPT_TOKEN_RUN: DataKey[TokenRun] = DataKey("tokenized-prompt-run")


class TokenSource(Protocol):
    def tokens(self, request: LLMRequest) -> list[int] | None:
        """The prompt's token ids, or None when they can not be had (then consumers estimate)."""
        ...


def request_tokens(request: LLMRequest) -> list[int] | None:
    return request.derived.get(PROMPT_TOKENS)


def request_token_run(request: LLMRequest) -> TokenRun | None:
    return request.derived.get(PROMPT_TOKEN_RUN)


def set_request_tokens(request: LLMRequest, tokens: list[int], run: TokenRun | None = None) -> None:
    request.derived.put(PROMPT_TOKENS, tokens)
    if run is not None:
        request.derived.put(PROMPT_TOKEN_RUN, run)
    else:
        request.derived.pop(PROMPT_TOKEN_RUN)
