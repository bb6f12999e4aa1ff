"""Where a request's prompt tokens (as the engine sees them) are kept once a `token-producer` has
made them: `LLMRequest.memo`, so every plugin of one process tokenizes a prompt once. Consumers
(the precise prefix producer) ask through `TokenSource`, which the token producer implements.
Beside them, the token cache's `TokenRun` they came from, when they did (its `ids` are the very
list memoised), where a consumer keeps what it derives from a hot prefix's tokens."""

from __future__ import annotations

from typing import Protocol

from scheduler.plugins.support.token_cache import TokenRun
from scheduler.types import LLMRequest

TOKENS_MEMO_KEY = "tokenized-prompt"
RUN_MEMO_KEY = "tokenized-prompt-run"


class TokenSource(Protocol):
    def tokens(self, request: LLMRequest) -> list[int] | None:
        """The prompt's token ids, or None when they can not be had (then consumers estimate)."""
        ...


def memo_tokens(request: LLMRequest) -> list[int] | None:
    return request.memo.get(TOKENS_MEMO_KEY)


def memo_token_run(request: LLMRequest) -> TokenRun | None:
    return request.memo.get(RUN_MEMO_KEY)


def set_memo_tokens(request: LLMRequest, tokens: list[int], run: TokenRun | None = None) -> None:
    request.memo[TOKENS_MEMO_KEY] = tokens
    if run is not None:
        request.memo[RUN_MEMO_KEY] = run
    else:
        request.memo.pop(RUN_MEMO_KEY, None)
