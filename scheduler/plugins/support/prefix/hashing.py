"""The approximate prefix producer: a prompt cut into blocks and hashed as a chain (GIE's
approximate prefix cache producer).

A block is `block_size_tokens x 4` bytes of the UTF-8 prompt text (4 characters per token is GIE's
estimate). The chain starts from xxh64(model name + cache_salt), so the same text under another
model or salt never matches; each block's hash is xxh64(block bytes + previous hash as 8
little-endian bytes), so a block's hash names the whole prefix up to and including it. As in GIE, a
prompt shorter than one block gives no hashes, a trailing partial block is hashed too, and at most
`max_blocks` blocks are hashed.

The hashes are kept in the request's data (`LLMRequest.derived`, under `prefix_hashes_key`), so every
profile and plugin in one process hashes a prompt once per (block size, max blocks); a caller that
hashed the prompt elsewhere gives them with `set_prefix_block_hashes`."""

from __future__ import annotations

from struct import Struct

import xxhash

from scheduler.data_keys import DataKey
from scheduler.types import LLMRequest

AVERAGE_CHARS_PER_TOKEN = 4
DEFAULT_BLOCK_SIZE_TOKENS = 16  # vLLM's default KV block size
DEFAULT_MAX_PREFIX_BLOCKS = 256

_pack_u64 = Struct("<Q").pack
_xxh64 = xxhash.xxh64_intdigest


def hash_blocks(data: bytes, seed_text: bytes, block_size_tokens: int, max_blocks: int) -> list[int]:
    """The chained block hashes of `data`; `seed_text` (model name + cache salt) seeds the chain."""
    block = block_size_tokens * AVERAGE_CHARS_PER_TOKEN
    if block <= 0 or len(data) < block:
        return []
    limit = block * max_blocks if max_blocks > 0 else 0
    if len(data) > limit:
        data = data[:limit]
    return chain_hashes(data, _xxh64(seed_text), block)


def chain_hashes(data: bytes, prev: int, block_bytes: int) -> list[int]:
    """The chain from `prev`: each `block_bytes` slice (the last may be partial) hashed with the
    previous hash, so a hash names its whole prefix. The precise index chains token ids this way."""
    hashes: list[int] = []
    append = hashes.append
    for start in range(0, len(data), block_bytes):  # the last slice is the partial block, if any
        prev = _xxh64(data[start : start + block_bytes] + _pack_u64(prev))
        append(prev)
    return hashes


def hash_prompt(
    prompt: str | bytes, model: str, block_size_tokens: int, max_blocks: int, cache_salt: str = ""
) -> list[int]:
    """The block hashes of a prompt for a model (and cache salt), without a request."""
    data = prompt.encode() if isinstance(prompt, str) else prompt
    return hash_blocks(data, (model + cache_salt).encode(), block_size_tokens, max_blocks)


def prefix_hashes_key(block_size_tokens: int, max_blocks: int) -> DataKey[list[int]]:
    """Where `prefix_block_hashes` keeps its result in the request's data, per geometry."""
    return DataKey(f"prefix-block-hashes/{block_size_tokens}x{max_blocks}")


def prefix_block_hashes(request: LLMRequest, block_size_tokens: int, max_blocks: int) -> list[int]:
    """The request's prompt block hashes (see the module doc), computed once per request and
    (block size, max blocks). The list is shared: do not modify it."""
    key = prefix_hashes_key(block_size_tokens, max_blocks)
    hashes = request.derived.get(key)
    if hashes is None:
        seed = (request.target_model + request.cache_salt()).encode()
        hashes = hash_blocks(request.prompt_text().encode(), seed, block_size_tokens, max_blocks)
        request.derived.put(key, hashes)
    return hashes


def set_prefix_block_hashes(request: LLMRequest, block_size_tokens: int, max_blocks: int, hashes: list[int]) -> None:
    """Give a request hashes computed elsewhere (in the same process: the request's data does not
    travel); `prefix_block_hashes` then returns them without the prompt."""
    request.derived.put(prefix_hashes_key(block_size_tokens, max_blocks), list(hashes))
