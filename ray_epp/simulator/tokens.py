"""Token approximation and prefix-block hashing.

The simulator has no tokenizer. A token is CHARS_PER_TOKEN characters of the prompt text (the usual
rule of thumb for English with a Llama-3 tokenizer is ~4), cut at fixed offsets so that two prompts
that share a text prefix share the same leading tokens and therefore the same block hashes. Prompts
given as token ids (a list of ints) are used as they are. Chat messages are flattened with a fixed,
Llama-3-like template so that the same conversation always yields the same text.

`token_ids` gives those tokens ids (what `/tokenize` answers and what KV events and vLLM-style
block keys are computed from): an ASCII chunk's id is its bytes read as a big-endian int (so
distinct chunks have distinct ids), any other chunk's is 2**32 + its CRC-32.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Sequence
from typing import Any

from ray_epp.kvevents import BlockHasher

CHARS_PER_TOKEN = 4

Prompt = str | list[int]


def count_tokens(prompt: Prompt) -> int:
    """Tokens in a prompt: ceil(chars / CHARS_PER_TOKEN) for text, the length for token ids."""
    if isinstance(prompt, str):
        return -(-len(prompt) // CHARS_PER_TOKEN)
    return len(prompt)


def token_ids(prompt: Prompt) -> list[int]:
    """The prompt's token ids: one per CHARS_PER_TOKEN characters of text (ids as they are)."""
    if not isinstance(prompt, str):
        return list(prompt)
    step = CHARS_PER_TOKEN
    n_full = len(prompt) // step
    if prompt.isascii():  # one C call for the whole chunks: 4 ASCII bytes = one big-endian uint32
        data = prompt.encode()
        out = list(struct.unpack(f">{n_full}I", data[: n_full * step]))
        if len(data) > n_full * step:
            out.append(int.from_bytes(data[n_full * step :], "big"))
        return out
    out = []
    for i in range(0, len(prompt), step):
        chunk = prompt[i : i + step]
        if chunk.isascii():
            out.append(int.from_bytes(chunk.encode(), "big"))
        else:
            out.append((1 << 32) + zlib.crc32(chunk.encode()))
    return out


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    # OpenAI content parts: [{"type": "text", "text": "..."}, {"type": "image_url", ...}]
    parts: list[str] = []
    for part in content:
        if isinstance(part, dict) and part.get("type", "text") == "text":
            parts.append(str(part.get("text", "")))
    return "".join(parts)


def parts_text(content: Any) -> str:
    """Content as the model reads it in the Responses and Anthropic APIs: a string, or its parts'
    texts with other parts (tool calls, tool results, images) as their JSON."""
    if isinstance(content, list):
        return "".join(str(p["text"]) if isinstance(p, dict) and "text" in p else json.dumps(p) for p in content)
    return "" if content is None else str(content)


def message_parts(messages: Sequence[Any]) -> list[tuple[str, str]]:
    """Chat messages as (role, text) pairs; dicts or objects with `role` / `content` attributes
    (the pydantic HTTP models)."""
    out: list[tuple[str, str]] = []
    for m in messages:
        if isinstance(m, dict):
            role, content = m.get("role", "user"), m.get("content")
        else:
            role, content = m.role, m.content
        out.append((str(role), _content_text(content)))
    return out


def flatten_messages(messages: Sequence[Any]) -> str:
    """Chat messages -> one prompt text, Llama-3 template style, ending with the assistant header."""
    out: list[str] = ["<|begin_of_text|>"]
    for role, text in message_parts(messages):
        out.append(f"<|start_header_id|>{role}<|end_header_id|>\n\n{text}<|eot_id|>")
    out.append("<|start_header_id|>assistant<|end_header_id|>\n\n")
    return "".join(out)


# One vLLM-style hasher per setting for every engine of the process: pods of one simulation see the
# same prompts, and a hasher remembers the blocks it hashed.
_HASHERS: dict[tuple[int, str, str | None], BlockHasher] = {}


def vllm_hasher(block_size: int, algo: str, seed: str | None) -> BlockHasher:
    """The shared `kvevents.BlockHasher` for vLLM block keys with these settings."""
    key = (block_size, algo, seed)
    h = _HASHERS.get(key)
    if h is None:
        h = _HASHERS[key] = BlockHasher(block_size, algo, seed)
    return h


def block_hashes(prompt: Prompt, block_size: int, extra_key: str | None = None) -> list[int]:
    """Chained hashes of the prompt's full blocks: h_i = hash((h_{i-1}, tokens of block i)).

    `extra_key` (the LoRA adapter name, as vLLM does) seeds the chain so that the same text under
    two adapters never shares KV blocks. Python's built-in hash is used: the values only need to be
    equal within one process, and it is the cheapest hash available.
    """
    n_full = count_tokens(prompt) // block_size
    h = hash(("lora", extra_key)) if extra_key else 0
    out = [0] * n_full
    if isinstance(prompt, str):
        step = block_size * CHARS_PER_TOKEN
        for i in range(n_full):
            h = hash((h, prompt[i * step : (i + 1) * step]))
            out[i] = h
    else:
        for i in range(n_full):
            h = hash((h, tuple(prompt[i * block_size : (i + 1) * block_size])))
            out[i] = h
    return out
