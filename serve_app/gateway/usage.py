"""The OpenAI `usage` of a response (prompt and completion tokens, and the prompt tokens the server
read from its cache), for the plugins that learn what a request cost (`ResponseUsage`) and the
token metrics: from a whole JSON body, or from the last event of a stream that carries it (vLLM
sends usage in a stream only with `stream_options.include_usage`; a Responses stream's
`response.completed` and an Anthropic stream's `message_start` + `message_delta` always carry it)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

# How much of a stream's end is kept to find its usage event (the last `data:` event before [DONE]).
STREAM_TAIL_BYTES = 8192
# How much of a stream's start is kept for an Anthropic stream's `message_start` (its input tokens).
STREAM_HEAD_BYTES = 4096


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


def _usage_events(data: bytes, latest_first: bool = False) -> Iterator[dict[str, Any]]:
    """The JSON objects of a stream's `data:` events that carry a usage, read one at a time."""
    lines = data.splitlines()
    for line in reversed(lines) if latest_first else lines:
        line = line.strip()
        if line.startswith(b"data:") and b'"usage"' in line:
            try:
                event = json.loads(line[5:])
            except ValueError:
                continue
            if isinstance(event, dict):
                yield event


def usage_counts_of_stream(tail: bytes, head: bytes = b"") -> tuple[int, int, int] | None:
    """The usage in the last `data:` event of a stream's tail that has one. An Anthropic stream
    splits it: `message_start` (the stream's `head`) has the input tokens, its last
    `message_delta` the output tokens so far; the two together are the request's usage."""
    for event in _usage_events(tail, latest_first=True):
        if event.get("type") == "message_delta":
            return _anthropic_usage(event, head + b"\n" + tail)
        found = usage_counts(event)
        if found is not None:
            return found
    return None


def _anthropic_usage(delta: dict[str, Any], stream: bytes) -> tuple[int, int, int] | None:
    start = next((e for e in _usage_events(stream) if e.get("type") == "message_start"), None)
    message = start.get("message") if start is not None else None
    usage = dict(message.get("usage") or {}) if isinstance(message, dict) else {}
    more = delta.get("usage")
    if isinstance(more, dict):  # the delta's counts are the latest (output so far; input, when it says)
        usage |= {k: v for k, v in more.items() if v is not None}
    return usage_counts({"usage": usage})


def usage_of_body(body: bytes) -> tuple[int, int] | None:
    counts = usage_counts_of_body(body)
    return None if counts is None else counts[:2]


def usage_of_stream(tail: bytes) -> tuple[int, int] | None:
    counts = usage_counts_of_stream(tail)
    return None if counts is None else counts[:2]
