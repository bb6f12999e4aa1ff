"""Paged KV cache with prefix caching, modelled on vLLM V1's block pool.

`num_blocks` blocks of `block_size` tokens. A block is referenced by the requests using it; a full
prompt block is registered under its chained hash so later requests with the same prefix reuse it.
Unreferenced blocks sit in one LRU free queue (cached ones stay findable until reused, which is the
eviction). Never-used blocks are handed out first, as vLLM's initial free queue is.

With `events` set to a list, an eviction appends vLLM's `BlockRemoved` (one event per run of
evictions) and `clear()` an `AllBlocksCleared`; the engine appends the `BlockStored` events.

With a CPU-offload tier (`cpu`, ray_epp.simulator.cpu_tier) an evicted cached block moves there:
its CPU `BlockStored` (and the CPU `BlockRemoved` of what that pushes out) precede its GPU
`BlockRemoved`, so a subscriber never sees a block held nowhere in between.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from ray_epp.kvevents import MEDIUM_GPU, AllBlocksCleared, BlockRemoved, BlockStored
from ray_epp.simulator.cpu_tier import CpuTier


class KVCache:
    __slots__ = (
        "block_hash",
        "block_size",
        "cached",
        "cpu",
        "enable_prefix_caching",
        "events",
        "evictions",
        "free_lru",
        "next_fresh",
        "num_blocks",
        "num_used",
        "ref",
    )

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref = [0] * num_blocks
        self.block_hash: dict[int, int] = {}  # block id -> hash, for cached blocks
        self.cached: dict[int, int] = {}  # hash -> block id
        self.free_lru: OrderedDict[int, None] = OrderedDict()  # unreferenced, used-before blocks
        self.next_fresh = 0  # blocks [next_fresh, num_blocks) were never used
        self.num_used = 0  # blocks with ref > 0
        self.evictions = 0
        self.events: list[Any] | None = None  # KV events for a publisher, when one listens
        self.cpu: CpuTier | None = None  # where evicted blocks go, when the pod offloads

    @property
    def num_free(self) -> int:
        return self.num_blocks - self.num_used

    def usage(self) -> float:
        """Fraction of blocks referenced by requests (vLLM's kv_cache_usage_perc, a 0..1 value)."""
        return self.num_used / self.num_blocks

    def match_prefix(self, hashes: list[int], max_blocks: int) -> list[int]:
        """Block ids of the longest cached prefix of `hashes`, at most `max_blocks` long."""
        if not self.enable_prefix_caching:
            return []
        cached = self.cached
        out: list[int] = []
        for h in hashes[:max_blocks]:
            b = cached.get(h)
            if b is None:
                break
            out.append(b)
        return out

    def evictable_count(self, block_ids: list[int]) -> int:
        """How many of these blocks are currently free (acquiring them takes them off the free queue)."""
        ref = self.ref
        return sum(1 for b in block_ids if ref[b] == 0)

    def acquire(self, block_ids: list[int]) -> None:
        ref = self.ref
        for b in block_ids:
            if ref[b] == 0:
                del self.free_lru[b]
                self.num_used += 1
            ref[b] += 1

    def allocate(self, n: int) -> list[int] | None:
        """n fresh-or-evicted blocks with ref 1, or None (and no change) when fewer are free."""
        if n > self.num_blocks - self.num_used:
            return None
        out: list[int] = []
        fresh = min(n, self.num_blocks - self.next_fresh)
        if fresh:
            out.extend(range(self.next_fresh, self.next_fresh + fresh))
            self.next_fresh += fresh
        ref = self.ref
        evicted: list[int] = []
        for _ in range(n - fresh):
            b, _unused = self.free_lru.popitem(last=False)
            h = self.block_hash.pop(b, None)
            if h is not None:
                del self.cached[h]
                evicted.append(h)
            out.append(b)
        if evicted:
            self.evictions += len(evicted)
            if self.cpu is not None:
                self.cpu.offload(evicted, self.events)
            if self.events is not None:
                for h in evicted:
                    self._removed(h)
        for b in out:
            ref[b] = 1
        self.num_used += n
        return out

    def cache_block(self, block_id: int, h: int) -> bool:
        """Register a full prompt block under its hash (first writer wins, like vLLM); True if new."""
        if self.enable_prefix_caching and h not in self.cached:
            self.cached[h] = block_id
            self.block_hash[block_id] = h
            return True
        return False

    def cache_blocks_with_events(
        self, blocks: list[int], hashes: list[int], tokens: list[int] | None, first: int, end: int, lora: str | None
    ) -> None:
        """Cache a request's blocks first..end-1 and emit one BlockStored per run of new ones."""
        events, bs = self.events, self.block_size
        assert events is not None and tokens is not None
        run_start = -1
        for i in range(first, end + 1):
            new = i < end and self.cache_block(blocks[i], hashes[i])
            if new and run_start < 0:
                run_start = i
            elif not new and run_start >= 0:
                events.append(BlockStored(
                    block_hashes=hashes[run_start:i],
                    parent_block_hash=hashes[run_start - 1] if run_start > 0 else None,
                    token_ids=tokens[run_start * bs : i * bs],
                    block_size=bs,
                    lora_name=lora,
                ))  # fmt: skip
                run_start = -1

    def _removed(self, h: int) -> None:
        events = self.events
        assert events is not None
        last = events[-1] if events else None
        if isinstance(last, BlockRemoved) and last.medium == MEDIUM_GPU:
            last.block_hashes.append(h)
        else:
            events.append(BlockRemoved([h]))

    def clear(self) -> None:
        """Forget every cached hash (vLLM's prefix-cache reset); blocks in use stay allocated."""
        self.cached.clear()
        self.block_hash.clear()
        if self.cpu is not None:
            self.cpu.clear()
        if self.events is not None:
            self.events.append(AllBlocksCleared())

    def release(self, block_ids: list[int]) -> None:
        """Drop one reference from each block; tail blocks are freed first so they are evicted first."""
        ref = self.ref
        lru = self.free_lru
        for b in reversed(block_ids):
            ref[b] -= 1
            if ref[b] == 0:
                lru[b] = None
                self.num_used -= 1
