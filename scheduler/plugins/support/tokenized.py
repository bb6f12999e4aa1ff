"""Where a request's prompt tokens (as the engine sees them) are kept once a `token-producer` has
made them: `LLMRequest.memo`, so every plugin of one process tokenizes a prompt once. Consumers
(the precise prefix producer) ask through `TokenSource`, which the token producer implements."""

from __future__ import annotations

from typing import Protocol

from scheduler.types import LLMRequest

TOKENS_MEMO_KEY = "tokenized-prompt"


class TokenSource(Protocol):
    def tokens(self, request: LLMRequest) -> list[int] | None:
        """The prompt's token ids, or None when they can not be had (then consumers estimate)."""
        ...


def memo_tokens(request: LLMRequest) -> list[int] | None:
    return request.memo.get(TOKENS_MEMO_KEY)


def set_memo_tokens(request: LLMRequest, tokens: list[int]) -> None:
    request.memo[TOKENS_MEMO_KEY] = tokens
