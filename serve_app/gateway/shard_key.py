"""Which shard of a profile's actors a request goes to (`profile_shards`).

A shard owns its own prefix index and in-flight ledgers, so the key must send every request that
could share a cached prefix to the same shard. Prefix matching is chained (a block matches only if
every block before it matches: scheduler/plugins/support/prefix/hashing.py), so two requests can
share cached blocks only if they share the first block: keying by the hash of the prompt's first
`key_tokens` tokens keeps prefix affinity exact while `key_tokens` is no more than the prefix
index's block size (16 tokens by default, 64 with llm-d's approx producer). When the configured
session header is present, its value is the key instead (all of a session on one shard).

The shard is computed once per request and kept in its derived data, so a request's later rounds and its
events (decision, first token, completion) reach the shard that made the decision."""

from __future__ import annotations

import xxhash

from scheduler import LLMRequest
from scheduler.data_keys import DataKey
from scheduler.plugins.support.prefix.hashing import AVERAGE_CHARS_PER_TOKEN, DEFAULT_BLOCK_SIZE_TOKENS, hash_prompt

PROFILE_SHARD: DataKey[int] = DataKey("profile-shard")


class ShardKey:
    def __init__(self, shards: int, key_tokens: int = DEFAULT_BLOCK_SIZE_TOKENS, session_header: str | None = None):
        if shards < 1:
            raise ValueError(f"shards must be at least 1 (got {shards})")
        self.shards = shards
        self.key_tokens = key_tokens
        self.session_header = session_header

    def shard_of(self, request: LLMRequest) -> int:
        if self.shards == 1:
            return 0
        shard = request.derived.get(PROFILE_SHARD)
        if shard is None:
            shard = self.key(request) % self.shards
            request.derived.put(PROFILE_SHARD, shard)
        return shard

    def key(self, request: LLMRequest) -> int:
        if self.session_header:
            session = request.header(self.session_header)
            if session:
                return xxhash.xxh64_intdigest(session.encode())
        chars = self.key_tokens * AVERAGE_CHARS_PER_TOKEN
        prompt = request.prompt_text().encode()[:chars]
        first = hash_prompt(prompt, request.target_model, self.key_tokens, 1, request.cache_salt())
        if first:
            return first[0]
        # Shorter than a block: no cached prefix to keep together; the whole prompt is the key.
        return xxhash.xxh64_intdigest(request.target_model.encode() + b"\0" + prompt)
