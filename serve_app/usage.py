"""The OpenAI `usage` of a response (prompt and completion tokens), for the plugins that learn what
a request cost (`ResponseUsage`): from a whole JSON body, or from the last event of a stream that
carries it (vLLM sends usage in a stream only with `stream_options.include_usage`)."""

from __future__ import annotations

import json
from typing import Any

# How much of a stream's end is kept to find its usage event (the last `data:` event before [DONE]).
STREAM_TAIL_BYTES = 8192


def usage_of(payload: Any) -> tuple[int, int] | None:
    usage = payload.get("usage") if isinstance(payload, dict) else None
    if not isinstance(usage, dict):
        return None
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if type(prompt) is not int or type(completion) is not int:
        return None
    return prompt, completion


def usage_of_body(body: bytes) -> tuple[int, int] | None:
    try:
        return usage_of(json.loads(body))
    except ValueError:
        return None


def usage_of_stream(tail: bytes) -> tuple[int, int] | None:
    """The usage in the last `data:` event of a stream's tail that has one."""
    for line in reversed(tail.splitlines()):
        line = line.strip()
        if line.startswith(b"data:") and b'"usage"' in line:
            found = usage_of_body(line[5:])
            if found is not None:
                return found
    return None
