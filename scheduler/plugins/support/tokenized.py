"""Where a request's prompt tokens (as the engine sees them) are kept once a `token-producer` has
made them: under PROMPT_TOKENS, the producer's typed key, in the request's derived data
(`LLMRequest.derived`: values derived from a request that outlive the call and stay in their
process), so every plugin of one process tokenizes a prompt once, a hook after the cycle (the
precise producer learning a decision) finds them, and they are not shipped to the profile actors
(each tokenizes again). The precise and burst prefix producers consume the key: the token producer
runs first. Beside them, the token cache's `TokenRun` they came from, when they did (its `ids` are
the very list kept), where a consumer keeps what it derives from a hot prefix's tokens."""

from __future__ import annotations

from scheduler.data_keys import DataKey
from scheduler.plugins.support.token_cache import TokenRun
from scheduler.types import LLMRequest

TOKEN_PRODUCER = "token-producer"  # the token producer's type name: llm-d's producers read it by that name
PROMPT_TOKENS: DataKey[list[int]] = DataKey("tokenized-prompt", TOKEN_PRODUCER)
PROMPT_TOKEN_RUN: DataKey[TokenRun] = DataKey("tokenized-prompt-run", TOKEN_PRODUCER)


def request_tokens(request: LLMRequest, key: DataKey[list[int]] = PROMPT_TOKENS) -> list[int] | None:
    return request.derived.get(key)


def request_token_run(request: LLMRequest) -> TokenRun | None:
    return request.derived.get(PROMPT_TOKEN_RUN)


def set_request_tokens(
    request: LLMRequest, tokens: list[int], run: TokenRun | None = None, key: DataKey[list[int]] = PROMPT_TOKENS
) -> None:
    request.derived.put(key, tokens)
    if run is not None:
        request.derived.put(PROMPT_TOKEN_RUN, run)
    else:
        request.derived.pop(PROMPT_TOKEN_RUN)
