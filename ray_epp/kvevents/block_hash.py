"""Block keys exactly as vLLM computes them (vllm/v1/core/kv_cache_utils.py, vllm/utils/hashing.py).

vLLM hashes each *full* block of `block_size` tokens, chained: a block's digest is the hash of the
tuple `(parent digest, block's token ids, extra keys)`, and the first block's parent is `NONE_HASH`,
the hash of a seed string (`resolve_none_hash_seed` in vllm/v1/core/kv_cache_utils.py): the engine's
`PYTHONHASHSEED` when set; unset, the fixed "vllm-none-hash" for the SHA-256 algorithms and 32
random bytes per process for the xxhash ones (such an engine's keys can be reproduced by no one).
The hash function is the engine's `--prefix-caching-hash-algo`:

* `sha256_cbor` (the default): SHA-256 of the canonical CBOR encoding (`cbor2`);
* `sha256`: SHA-256 of the pickle (highest protocol) — Python-specific;
* `xxhash_cbor` / `xxhash`: the same two encodings under xxh3-128.

Extra keys: the LoRA adapter (its name in current vLLM, its int id in older ones) on every block,
and the request's `cache_salt` on the first block only; `None` when there are none. The event
carries the digest's external form: the low 64 bits, big-endian, as an unsigned int
(`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1`, vLLM's default) — `external_hash`.
"""

from __future__ import annotations

import hashlib
import os
import pickle
from collections.abc import Callable, Sequence
from typing import Any

import cbor2
import xxhash

_MASK64 = (1 << 64) - 1
_MEMO_LIMIT = 1 << 16


def _cbor(obj: Any) -> bytes:
    return cbor2.dumps(obj, canonical=True)


def _pickle(obj: Any) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def _sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


HASH_ALGOS: dict[str, tuple[Callable[[Any], bytes], Callable[[bytes], bytes]]] = {
    "sha256_cbor": (_cbor, _sha256),
    "sha256": (_pickle, _sha256),
    "xxhash_cbor": (_cbor, xxhash.xxh3_128_digest),
    "xxhash": (_pickle, xxhash.xxh3_128_digest),
}


DEFAULT_NONE_HASH_SEED = "vllm-none-hash"  # vLLM's seed without PYTHONHASHSEED, SHA-256 algorithms
NON_CRYPTO_ALGOS = frozenset({"xxhash", "xxhash_cbor"})  # their unset seed is random per process


def none_hash_seed(algo: str, pythonhashseed: str | None) -> str:
    """The seed vLLM derives NONE_HASH from: PYTHONHASHSEED when set, else the fixed default for
    the SHA-256 algorithms and fresh random bytes for the xxhash ones."""
    if pythonhashseed is not None:
        return str(pythonhashseed)
    if algo in NON_CRYPTO_ALGOS:
        return os.urandom(32).hex()
    return DEFAULT_NONE_HASH_SEED


def external_hash(digest: bytes) -> int:
    """The int vLLM publishes for a block digest: its last 8 bytes, big-endian, unsigned."""
    return int.from_bytes(digest, "big") & _MASK64


class BlockHasher:
    """vLLM's block keys for one engine setting (block size, hash algorithm, seed).

    `seed` is the engine's `PYTHONHASHSEED`; `None`: unset, as vLLM resolves it (`none_hash_seed`).
    A hasher remembers the digests it made (bounded), so a chain can be continued from an external
    `parent` hash it produced, and a hot prefix is hashed once.
    """

    __slots__ = ("_digest", "_encode", "_full", "_memo", "algo", "block_size", "none_hash", "seed")

    def __init__(self, block_size: int, algo: str = "sha256_cbor", seed: str | None = None) -> None:
        if not isinstance(block_size, int) or block_size <= 0:
            raise ValueError(f"block_size must be a positive int, got {block_size!r}")
        if algo not in HASH_ALGOS:
            raise ValueError(f"unknown prefix-caching hash algorithm {algo!r}: one of {sorted(HASH_ALGOS)}")
        self.block_size = block_size
        self.algo = algo
        self.seed = none_hash_seed(algo, seed)
        self._encode, self._digest = HASH_ALGOS[algo]
        self.none_hash = self._digest(self._encode(self.seed))
        self._memo: dict[tuple[bytes, tuple[int, ...], tuple[Any, ...] | None], bytes] = {}
        self._full: dict[int, bytes] = {}  # external hash -> digest, for chains continued by `parent`

    def block_digest(self, parent: bytes | None, tokens: Sequence[int], extra: tuple[Any, ...] | None = None) -> bytes:
        """One block's digest (vLLM's hash_block_tokens); `parent` None or empty is the first block."""
        key = (parent or self.none_hash, tuple(tokens), extra)
        d = self._memo.get(key)
        if d is None:
            d = self._digest(self._encode(key))
            if len(self._memo) >= _MEMO_LIMIT:
                self._memo.clear()
                self._full.clear()
            self._memo[key] = d
            self._full[external_hash(d)] = d
        return d

    def digests(
        self,
        token_ids: Sequence[int],
        lora: int | str | None = None,
        parent: bytes | None = None,
        cache_salt: str | None = None,
    ) -> list[bytes]:
        """The digests of the full blocks of `token_ids`, continuing the chain after `parent`."""
        bs = self.block_size
        out: list[bytes] = []
        prev = parent
        lora_keys: tuple[Any, ...] = () if lora is None else (lora,)
        for i in range(len(token_ids) // bs):
            first = i == 0 and parent is None
            extra_list = lora_keys + ((cache_salt,) if first and cache_salt else ())
            prev = self.block_digest(prev, token_ids[i * bs : (i + 1) * bs], extra_list or None)
            out.append(prev)
        return out

    def hashes(
        self,
        token_ids: Sequence[int],
        lora_id: int | str | None = None,
        parent: int | None = None,
        *,
        lora_name: str | None = None,
        cache_salt: str | None = None,
    ) -> list[int]:
        """The external hashes vLLM puts in `BlockStored` for the full blocks of `token_ids`.

        The LoRA key is `lora_name` (current vLLM) when given, else `lora_id` (older vLLM keyed
        blocks by the adapter's int id). `parent` continues a chain: it must be a hash this hasher
        made (the digest behind it is needed, and the event's 64 bits do not hold it).
        """
        parent_digest = None
        if parent is not None:
            parent_digest = self._full.get(parent)
            if parent_digest is None:
                raise KeyError(f"parent hash {parent} was not made by this hasher (or was forgotten)")
        lora = lora_name if lora_name is not None else lora_id
        return [external_hash(d) for d in self.digests(token_ids, lora, parent_digest, cache_salt)]
