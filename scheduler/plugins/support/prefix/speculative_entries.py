"""What the router predicts a pod will hold: a routed prompt's block keys, kept for a TTL until the
pod's own KV events can confirm them (llm-d's speculative indexing, `speculativeIndexing` /
`speculativeTTL` of its precise prefix producer).

Why: a pod publishes `BlockStored` only once it has computed the blocks, after the request's queue
wait and prefill. Until then the precise index says the pod holds nothing of the prompt, so a second
request of the same prefix arriving in that window looks cold and may be sent elsewhere, to prefill
the same prefix a second time. A speculative entry closes that window; when it expires the
confirmed entries (if the pod did cache the blocks) carry on, and if the pod never did (the request
failed, or the blocks were evicted at once) the prediction ends with its TTL.

Entries are kept apart from the confirmed index, as llm-d keeps them as separate pod entries: an
event never removes a speculative entry and a TTL never removes a confirmed one. A key predicted
again for the same pod lives until its newest prediction's TTL. Bounded: at most `max_entries`
(pod, key) entries; past that the oldest predictions end early.

Time is given by the caller (`now`), so the simulation's virtual clock and tests drive it; `expire`
is called before each lookup and each prediction. Every method runs to completion without
awaiting (one thread or one asyncio loop)."""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Iterable, Sequence

from scheduler.plugins.support.prefix.index import PrefixIndex

MAX_SPECULATIVE_ENTRIES = 1_000_000  # (pod, key) entries across pods: ~100 MB at the very most


class SpeculativeEntries:
    """add(pod, keys, now); expire(now); match(keys) → {pod: leading blocks}; remove_pod."""

    __slots__ = ("_expiry", "_index", "_records", "added", "expired", "max_entries", "ttl_s")

    def __init__(self, ttl_s: float, max_entries: int = MAX_SPECULATIVE_ENTRIES) -> None:
        if ttl_s <= 0:
            raise ValueError(f"a speculative TTL must be > 0, got {ttl_s}")
        if max_entries <= 0:
            raise ValueError(f"max_entries must be > 0, got {max_entries}")
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._index = PrefixIndex(sys.maxsize)  # key → pods (no LRU: the TTL and max_entries bound it)
        self._expiry: dict[str, dict[int, float]] = {}  # pod → key → when its newest prediction ends
        self._records: deque[tuple[float, str, Sequence[int]]] = deque()  # oldest first (one TTL for all)
        self.added = 0  # predictions made (one per pod per routed request)
        self.expired = 0  # predictions ended (TTL, or pushed out by max_entries)

    def __len__(self) -> int:
        """(pod, key) entries held."""
        return sum(map(len, self._expiry.values()))

    def add(self, pod: str, keys: Sequence[int], now: float) -> None:
        """`pod` was just sent a prompt with these block keys: it should hold them soon."""
        if not keys:
            return
        self.expire(now)
        until = now + self.ttl_s
        expiry = self._expiry.setdefault(pod, {})
        for key in keys:
            expiry[key] = until
        self._index.add(keys, pod)
        self._records.append((until, pod, keys))
        self.added += 1
        while len(self) > self.max_entries and self._records:
            self._end(*self._records.popleft(), now=0.0)  # early: only what no newer prediction holds

    def expire(self, now: float) -> None:
        """End every prediction whose TTL has passed."""
        records = self._records
        while records and records[0][0] <= now:
            self._end(*records.popleft(), now=now)

    def match(self, keys: Iterable[int]) -> dict[str, int]:
        """Per pod, how many leading blocks of the prompt it is predicted to hold (pods with none
        absent)."""
        return self._index.match_contiguous(keys)

    def get(self, key: int) -> set[str]:
        """The pods predicted to hold a block."""
        return self._index.get(key)

    def remove_pod(self, pod: str) -> None:
        """The pod left the pool: its predictions go with it."""
        self._index.remove_server(pod)
        self._expiry.pop(pod, None)

    def _end(self, until: float, pod: str, keys: Sequence[int], now: float) -> None:
        """One prediction's end: drop its keys unless a newer, unexpired prediction of the same pod
        holds them (records end oldest first, so a key whose newest end is at most this one's, or
        already past, has no such prediction)."""
        self.expired += 1
        expiry = self._expiry.get(pod)
        if expiry is None:
            return  # the pod left
        limit = max(until, now)
        gone = [key for key in keys if expiry.get(key, sys.float_info.max) <= limit]
        for key in gone:
            expiry.pop(key, None)
        self._index.discard(gone, pod)
        if not expiry:
            self.remove_pod(pod)
