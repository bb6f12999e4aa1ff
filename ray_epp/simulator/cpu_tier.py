"""A pod's CPU-offload tier: the blocks its GPU cache evicted, kept in host memory (an LRU of block
hashes), from where a later request with the same prefix loads them instead of recomputing.

vLLM's CPU offloading (the `OffloadingConnector`, `kv_connector_extra_config.num_cpu_blocks`)
publishes the tier's changes as KV events with `medium="CPU"`: a `BlockStored` that names the
blocks by their (GPU) hashes without token ids or a parent (the GPU store already carried them),
and a `BlockRemoved` when the tier drops one. This tier publishes the same. Unlike vLLM's connector,
which stores a computed block to the CPU at once and keeps that copy when it is loaded back (an
inclusive tier), this one holds only what the GPU evicted and gives a block back on a load (an
exclusive victim tier): the two differ in how much fits, not in what the router sees or is scored
by.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from ray_epp.kvevents import MEDIUM_CPU, BlockRemoved, BlockStored


class CpuTier:
    """offload(hashes) after a GPU eviction; match(hashes, start, stop) → how many blocks from
    `start` it holds in a row; take(hashes) removes them (a load back to the GPU)."""

    __slots__ = ("block_size", "capacity", "dropped", "lru", "offloaded", "taken")

    def __init__(self, capacity: int, block_size: int) -> None:
        if capacity <= 0:
            raise ValueError(f"a CPU tier needs a capacity > 0 blocks, got {capacity}")
        self.capacity = capacity
        self.block_size = block_size
        self.lru: OrderedDict[int, None] = OrderedDict()  # block hash, least recently offloaded first
        self.offloaded = 0  # blocks stored here (GPU evictions)
        self.dropped = 0  # blocks that fell out of the tier
        self.taken = 0  # blocks loaded back to the GPU

    def __len__(self) -> int:
        return len(self.lru)

    def __contains__(self, h: int) -> bool:
        return h in self.lru

    def offload(self, hashes: list[int], events: list[Any] | None) -> None:
        """Keep blocks the GPU just evicted; the oldest fall out past the capacity. With `events`,
        a CPU `BlockStored` for the new ones, then a CPU `BlockRemoved` for those that fell out."""
        lru = self.lru
        new: list[int] = []
        for h in hashes:
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
                new.append(h)
        self.offloaded += len(new)
        gone: list[int] = []
        while len(lru) > self.capacity:
            gone.append(lru.popitem(last=False)[0])
        self.dropped += len(gone)
        if events is not None:
            if new:
                events.append(BlockStored(new, None, [], self.block_size, medium=MEDIUM_CPU))
            if gone:
                events.append(BlockRemoved(gone, medium=MEDIUM_CPU))

    def match(self, hashes: list[int], start: int, stop: int) -> int:
        """How many of hashes[start:stop] the tier holds in a row (a load continues a GPU hit)."""
        lru = self.lru
        n = 0
        for i in range(start, min(stop, len(hashes))):
            if hashes[i] not in lru:
                break
            n += 1
        return n

    def take(self, hashes: list[int]) -> None:
        """These blocks go back to the GPU (their CPU `BlockRemoved` is the caller's, once the GPU
        store is published)."""
        for h in hashes:
            del self.lru[h]
        self.taken += len(hashes)

    def clear(self) -> None:
        self.lru.clear()
