"""Which servers probably hold which prefix blocks: block hash → servers, with an LRU of hashes
per server (GIE's approximate prefix indexer).

Each server gets a bit; a hash maps to the bit mask of the servers holding it, so a prefix walk is
one dict lookup per block and runs of blocks held by the same servers are counted once. Each
server's hashes sit in an OrderedDict in least-recently-added order; when it outgrows its capacity
the oldest hash is evicted and the server's bit is cleared from that hash. Invariant: a hash's mask
has a server's bit exactly when the hash is in that server's LRU.

Plain Python, no locks: every method runs to completion without awaiting, so it is safe to call
from one thread or one asyncio loop."""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Iterable
from itertools import groupby

from scheduler.data_keys import DataKey
from scheduler.plugins.support.prefix.hashing import DEFAULT_BLOCK_SIZE_TOKENS

# A Llama-3-8B on an 80 GB H100 caches about 500K tokens: 31,250 blocks of 16 tokens (GIE's note).
DEFAULT_LRU_CAPACITY_PER_SERVER = 500_000 // DEFAULT_BLOCK_SIZE_TOKENS


class _ServerEntry:
    __slots__ = ("bit", "capacity", "index", "lru")

    def __init__(self, index: int, capacity: int) -> None:
        self.index = index
        self.bit = 1 << index
        self.capacity = capacity
        self.lru: OrderedDict[int, None] = OrderedDict()


class PrefixIndex:
    """add(hashes, server), discard(hashes, server), match(hashes) → {server: blocks}, remove_server,
    servers."""

    __slots__ = ("_by_index", "_free", "_masks", "_servers", "default_capacity")

    def __init__(self, default_capacity: int = DEFAULT_LRU_CAPACITY_PER_SERVER) -> None:
        if default_capacity <= 0:
            raise ValueError(f"an LRU capacity must be > 0, got {default_capacity}")
        self.default_capacity = default_capacity
        self._masks: dict[int, int] = {}  # block hash → bit mask of the servers holding it (never 0)
        self._servers: dict[str, _ServerEntry] = {}
        self._by_index: list[str] = []  # bit index → server name ("" when free)
        self._free: list[int] = []  # released bit indices (a heap: reuse the lowest, keep masks short)

    def add(self, hashes: Iterable[int], server: str, capacity: int | None = None) -> None:
        """Record that `server` now holds these blocks (most recent last). `capacity` sizes the
        server's LRU when it is new (default: `default_capacity`); a known server keeps its size."""
        entry = self._servers.get(server)
        if entry is None:
            entry = self._new_server(server, capacity if capacity is not None and capacity > 0 else None)
        lru, bit, cap, masks = entry.lru, entry.bit, entry.capacity, self._masks
        for h in hashes:
            if h in lru:
                lru.move_to_end(h)
                continue
            lru[h] = None
            masks[h] = masks.get(h, 0) | bit
            if len(lru) > cap:
                old, _ = lru.popitem(last=False)
                mask = masks[old] & ~bit
                if mask:
                    masks[old] = mask
                else:
                    del masks[old]

    def discard(self, hashes: Iterable[int], server: str) -> int:
        """`server` no longer holds these blocks (an eviction it reported); returns how many it held."""
        entry = self._servers.get(server)
        if entry is None:
            return 0
        lru, keep, masks = entry.lru, ~entry.bit, self._masks
        gone = 0
        for h in hashes:
            if h in lru:
                del lru[h]
                gone += 1
                mask = masks[h] & keep
                if mask:
                    masks[h] = mask
                else:
                    del masks[h]
        return gone

    def get(self, block_hash: int) -> set[str]:
        """The servers holding a block (a new set)."""
        return set(self._names_of(self._masks.get(block_hash, 0)))

    def holds(self, block_hash: int, server: str) -> bool:
        entry = self._servers.get(server)
        return entry is not None and block_hash in entry.lru

    def match(self, hashes: Iterable[int]) -> dict[str, int]:
        """Longest-prefix match (GIE's matchLongestPrefix): walk the hashes in order and stop at the
        first one no server holds; a server's count is how many of the walked blocks it holds.
        Servers with no block are absent."""
        get = self._masks.get
        walked: list[int] = []  # the masks of the walked blocks
        append = walked.append
        for h in hashes:  # each lookup is likely a cache miss in a big dict: stop at the first unknown block
            mask = get(h)
            if mask is None:
                break
            append(mask)
        if not walked:
            return {}
        first = walked[0]
        if walked.count(first) == len(walked):  # the common case: the same servers hold every block
            return dict.fromkeys(self._names_of(first), len(walked))
        counts: dict[str, int] = {}
        by_index = self._by_index
        for mask, run in groupby(walked):
            n = len(list(run))
            while mask:
                low = mask & -mask
                name = by_index[low.bit_length() - 1]
                counts[name] = counts.get(name, 0) + n
                mask ^= low
        return counts

    def match_contiguous(self, hashes: Iterable[int]) -> dict[str, int]:
        """Per server, its longest run of leading blocks: a server that lacks a block holds
        nothing after it (an engine's prefix cache hits only up to its first missing block).
        Servers with no first block are absent."""
        get = self._masks.get
        alive = 0
        counts: dict[str, int] = {}
        by_index = self._by_index
        depth = 0
        for h in hashes:
            mask = get(h, 0)
            if depth == 0:
                alive = mask
            ended = alive & ~mask
            while ended:  # servers whose run ends before this block
                low = ended & -ended
                counts[by_index[low.bit_length() - 1]] = depth
                ended ^= low
            alive &= mask
            if not alive:
                break
            depth += 1
        for name in self._names_of(alive):
            counts[name] = depth
        return counts

    def remove_server(self, server: str) -> bool:
        """Forget a server and every block it held; False when it was not known."""
        entry = self._servers.pop(server, None)
        if entry is None:
            return False
        keep = ~entry.bit
        masks = self._masks
        for h in entry.lru:
            mask = masks[h] & keep
            if mask:
                masks[h] = mask
            else:
                del masks[h]
        self._by_index[entry.index] = ""
        heapq.heappush(self._free, entry.index)
        return True

    def servers(self) -> list[str]:
        return list(self._servers)

    def server_size(self, server: str) -> int:
        """How many blocks the index holds for a server (0 when unknown)."""
        entry = self._servers.get(server)
        return len(entry.lru) if entry is not None else 0

    def server_capacity(self, server: str) -> int:
        """A known server's LRU capacity (0 when unknown)."""
        entry = self._servers.get(server)
        return entry.capacity if entry is not None else 0

    def __len__(self) -> int:
        """The number of distinct block hashes held by any server."""
        return len(self._masks)

    def entries(self) -> int:
        """Entries over every server's LRU (a hash two servers hold counts twice): GIE's size."""
        return sum(len(entry.lru) for entry in self._servers.values())

    def _new_server(self, server: str, capacity: int | None) -> _ServerEntry:
        if self._free:
            index = heapq.heappop(self._free)
        else:
            index = len(self._by_index)
            self._by_index.append("")
        self._by_index[index] = server
        entry = self._servers[server] = _ServerEntry(index, capacity or self.default_capacity)
        return entry

    def _names_of(self, mask: int) -> list[str]:
        names: list[str] = []
        by_index = self._by_index
        while mask:
            low = mask & -mask
            names.append(by_index[low.bit_length() - 1])
            mask ^= low
        return names


class IndexHoldings:
    """How many blocks a prefix producer's index holds per server, read when asked rather than
    copied for every endpoint of the pool each cycle (what `prefix-home-balance-scorer` weighs; the
    index changes only when a decision is learned, after the cycle that reads this). A copy sent to
    another process carries no index: it holds nothing for anyone there."""

    __slots__ = ("_index",)

    def __init__(self, index: PrefixIndex | None) -> None:
        self._index = index

    def blocks(self, server: str) -> int:
        return self._index.server_size(server) if self._index is not None else 0

    def __reduce__(self) -> tuple[type[IndexHoldings], tuple[None]]:
        return IndexHoldings, (None,)


# What a prefix producer with an index writes beside its match: its index's holdings.
PREFIX_INDEX_HOLDINGS: DataKey[IndexHoldings] = DataKey("prefix-index-holdings", "approx-prefix-cache-producer")
