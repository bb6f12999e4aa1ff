"""How deep a YAML / JSON text nests its flow collections, read without parsing it.

PyYAML's scanner and parser slow down sharply with nesting (seconds for a few thousand `[`, ~14 s
at load 37 on this machine) before they give up with RecursionError; a file loader checks this
linear count first and refuses the file at once."""

from __future__ import annotations

MAX_FILE_NESTING = 200  # no real config, pods file or settings file nests its brackets this deep


def nests_deeper_than(text: str, limit: int = MAX_FILE_NESTING) -> bool:
    """Whether `[` / `{` open more than `limit` deep outside quoted strings."""
    if text.count("[") + text.count("{") <= limit:
        return False
    depth = 0
    quote = ""
    escaped = False
    for ch in text:
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\" and quote == '"':
                escaped = True
            elif ch == quote:
                quote = ""
        elif ch in "[{":
            depth += 1
            if depth > limit:
                return True
        elif ch in "]}":
            depth = max(0, depth - 1)
        elif ch in "\"'":
            quote = ch
    return False
