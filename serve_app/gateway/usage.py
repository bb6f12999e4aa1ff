"""The OpenAI `usage` of a response (prompt and completion tokens, and the prompt tokens the server
read from its cache), for the plugins that learn what a request cost (`ResponseUsage`) and the
token metrics: from a whole JSON body, or from the last event of a stream that carries it (vLLM
sends usage in a stream only with `stream_options.include_usage`)."""

from __future__ import annotations

import json
from typing import Any

# How much of a stream's end is kept to find its usage event (the last `data:` event before [DONE]).
STREAM_TAIL_BYTES = 8192


def usage_counts(payload: Any) -> tuple[int, int, int] | None:
    """(prompt, completion, cached prompt tokens; cached -1 when the usage does not say). The
    Responses API's usage (`input_tokens`, `output_tokens`, in a stream's `response.completed`
    under `response`) and Anthropic's (`cache_read_input_tokens`) count the same tokens."""
    if isinstance(payload, dict) and isinstance(payload.get("response"), dict):
        payload = payload["response"]
    usage = payload.get("usage") if isinstance(payload, dict) else None
    if not isinstance(usage, dict):
        return None
    prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
    completion = usage.get("completion_tokens", usage.get("output_tokens"))
    if type(prompt) is not int or type(completion) is not int:
        return None
    details = usage.get("prompt_tokens_details", usage.get("input_tokens_details"))
    cached = details.get("cached_tokens") if isinstance(details, dict) else usage.get("cache_read_input_tokens")
    return prompt, completion, cached if type(cached) is int and cached >= 0 else -1


def usage_of(payload: Any) -> tuple[int, int] | None:
    counts = usage_counts(payload)
    return None if counts is None else counts[:2]


def usage_counts_of_body(body: bytes) -> tuple[int, int, int] | None:
    try:
        return usage_counts(json.loads(body))
    except ValueError:
        return None


def usage_counts_of_stream(tail: bytes) -> tuple[int, int, int] | None:
    """The usage in the last `data:` event of a stream's tail that has one."""
    for line in reversed(tail.splitlines()):
        line = line.strip()
        if line.startswith(b"data:") and b'"usage"' in line:
            found = usage_counts_of_body(line[5:])
            if found is not None:
                return found
    return None


def usage_of_body(body: bytes) -> tuple[int, int] | None:
    counts = usage_counts_of_body(body)
    return None if counts is None else counts[:2]


def usage_of_stream(tail: bytes) -> tuple[int, int] | None:
    counts = usage_counts_of_stream(tail)
    return None if counts is None else counts[:2]
