"""Which pod really holds which KV blocks, from the pods' own KV-cache events (llm-d's precise
prefix index, llm-d-kv-cache's kvblock index).

Keys are recomputed here from token ids, on both sides: a request's prompt tokens are cut into
blocks of `block_size` tokens and chained (`chain_keys`: xxh64 of each block's ids as 4-byte
integers, seeded with the previous key), and a `BlockStored` event's own `token_ids` are chained the same
way from its parent's key. So the engine's hash algorithm and seed need not match the router's (as
in llm-d with no session manager); only the block size must (an event of another block size is
counted in `skipped` and not indexed). The engine's block hashes serve as opaque names, mapped per
pod to their keys, so a `BlockRemoved` (which carries only engine hashes) can find what to drop.

Bounded in memory: each pod's keys sit in an LRU of `capacity` blocks (its KV cache size in blocks
when the engine reports it, else `default_capacity`); the engine-hash map of a pod is bounded the
same way. A pod whose removals were lost (a gap) can therefore never grow without end; its oldest
blocks fall out first, as they would on the engine.

Device tiers (llm-d's): a block is indexed per (pod, tier), the tier being the event's `medium`
(`tier_weights.tier_of`: none is the GPU). GPU blocks sit in `blocks`, each other tier in an index of
its own (`offloaded`, bounded per pod by the larger of the pod's capacity and `default_capacity`). A
`BlockRemoved` drops the block from its own tier only. vLLM's CPU offloading names the blocks it
stored by their engine hashes without token ids (the GPU store carried them): such a store is
indexed by the keys those names already have. A match weighs each pod's run by the tiers its blocks
are in (`tier_weights`, llm-d's rule); while no pod has a block off the GPU and the weights are
plain, it is the block count, computed as before.

With speculative indexing on (`speculative`, scheduler.plugins.support.prefix.speculative_entries)
a pod also counts as holding the blocks of prompts just routed to it, until their TTL: the events
confirm what it really cached, the prediction covers the time before they can.

What is not distinguished: LoRA adapters and `cache_salt` (vLLM puts both into its hashes, but the
events name an adapter by a number the router cannot map to a name); a pod serves one base model.

Every method runs to completion without awaiting (one thread or one asyncio loop)."""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import xxhash

from scheduler.plugins.support.prefix.index import DEFAULT_LRU_CAPACITY_PER_SERVER, PrefixIndex
from scheduler.plugins.support.prefix.speculative_entries import SpeculativeEntries
from scheduler.plugins.support.prefix.tier_weights import (
    GPU_TIER,
    Holders,
    TierWeights,
    tier_of,
    weighted_longest_prefix,
    whole_blocks,
)
from scheduler.plugins.support.token_cache import TokenRun

ROOT_KEY = xxhash.xxh64_intdigest(b"ray-epp/precise-prefix")  # the chain's start for a block without a parent
_KEYS_TAG = "precise-block-keys"  # where a TokenRun keeps its keys (with the block size)

LIVE, GAPPED, SILENT, UNKNOWN = "live", "gapped", "silent", "unknown"
TOKEN_BYTES = 4  # each token id as one unsigned 32-bit integer


_xxh64 = xxhash.xxh64_intdigest


def chain_keys(data: bytes, prev: int, block_bytes: int) -> list[int]:
    """Each full `block_bytes` slice hashed with xxh64 seeded by the previous key, so a key names
    its whole prefix (the seed saves the approximate chain's concatenation: ~2x faster per block)."""
    keys: list[int] = []
    append = keys.append
    for start in range(0, len(data) - block_bytes + 1, block_bytes):
        prev = _xxh64(data[start : start + block_bytes], prev)
        append(prev)
    return keys


def token_bytes(tokens: Sequence[int]) -> bytes:
    """Each id as 4 bytes; an id of 2**32 or more (no real vocabulary has one) is folded to 32 bits
    the same way wherever it appears, so both sides still agree. A list (what tokenizers and JSON
    give) goes through `array.fromlist`, ~1.4x faster than the generic constructor: on a cold
    prompt this conversion is most of what the precise keys cost over hashing text."""
    out = array("I")
    try:
        if type(tokens) is list:
            out.fromlist(tokens)
        else:
            out = array("I", tokens)
    except OverflowError:
        out = array("I", [(t ^ (t >> 32)) & 0xFFFFFFFF for t in tokens])
    return out.tobytes()


@dataclass(slots=True)
class EventCounts:
    """What the index did with the events it was given (shown in a profile actor's info)."""

    batches: int = 0
    stored: int = 0
    removed: int = 0
    cleared: int = 0
    skipped: int = 0  # another block size, a parent never seen, unknown names of a tier's store, malformed
    unknown_removed: int = 0  # a removed engine hash this index never saw stored


class PreciseIndex:
    """apply(pod, events); keys(tokens) → the request's block keys; match(keys) → {pod: blocks};
    status per pod; remove_pod."""

    __slots__ = (
        "_capacity",
        "_engine",
        "_status",
        "block_size",
        "blocks",
        "counts",
        "default_capacity",
        "offloaded",
        "speculative",
        "weights",
    )

    def __init__(
        self,
        block_size: int,
        default_capacity: int = DEFAULT_LRU_CAPACITY_PER_SERVER,
        weights: TierWeights | None = None,
    ) -> None:
        if block_size <= 0:
            raise ValueError(f"a block size must be > 0, got {block_size}")
        self.block_size = block_size
        self.default_capacity = default_capacity
        self.blocks = PrefixIndex(default_capacity)  # key → pods holding it on the GPU, an LRU of keys per pod
        self.offloaded: dict[str, PrefixIndex] = {}  # another tier → its key → pods
        self.weights = weights if weights is not None else TierWeights()
        self._engine: dict[str, OrderedDict[object, int]] = {}  # pod → engine hash → key
        self._capacity: dict[str, int] = {}
        self._status: dict[str, str] = {}
        self.counts = EventCounts()
        # Predicted blocks of routed prompts, until their TTL (None: speculative indexing off).
        self.speculative: SpeculativeEntries | None = None

    # -- the request side ----------------------------------------------------------------------

    def keys(self, tokens: Sequence[int], max_blocks: int = 0, run: TokenRun | None = None) -> list[int]:
        """The block keys of a prompt's full blocks (a partial last block is never cached). With
        the token cache's `run` of these very tokens, its keys are kept on it (and on the head it
        was built on), so a hot prefix is hashed once and a prompt on it hashes only its rest."""
        full = len(tokens) // self.block_size
        if max_blocks > 0:
            full = min(full, max_blocks)
        if not full:
            return []
        if run is not None and run.ids is tokens:
            return self._run_keys(run)[:full]
        bs = self.block_size
        if len(tokens) >= (full + 1) * bs:  # cut by max_blocks: copy only what is hashed
            tokens = tokens[: full * bs]
        # else the partial last block (< one block) is converted and left unhashed: cheaper than a copy
        return chain_keys(token_bytes(tokens), ROOT_KEY, bs * TOKEN_BYTES)

    def _run_keys(self, run: TokenRun) -> list[int]:
        """Every full block's key of a run, kept in `run.derived` by block size."""
        bs = self.block_size
        tag = (_KEYS_TAG, bs)
        keys = run.derived.get(tag)
        if keys is None:
            base = self._run_keys(run.head) if run.head is not None else []
            done, full = len(base), len(run.ids) // bs
            start = base[-1] if base else ROOT_KEY
            rest = chain_keys(token_bytes(run.ids[done * bs : full * bs]), start, bs * TOKEN_BYTES)
            keys = run.derived[tag] = base + rest if base else rest
        return keys

    def lookup(
        self, tokens: Sequence[int], max_blocks: int = 0, run: TokenRun | None = None
    ) -> tuple[dict[str, int], int]:
        """`match(keys(...))` and the prompt's full-block count, without hashing the rest of a
        prompt whose first block no pod holds (a new prompt: the common case on unique traffic)."""
        full = len(tokens) // self.block_size
        if max_blocks > 0:
            full = min(full, max_blocks)
        if not full:
            return {}, 0
        if run is None or run.ids is not tokens:
            bs = self.block_size
            first = _xxh64(token_bytes(list(tokens[:bs])), ROOT_KEY)
            held = self.blocks.get(first) or any(tier.get(first) for tier in self.offloaded.values())
            if not held and (self.speculative is None or not self.speculative.match((first,))):
                return {}, full
        return self.match(self.keys(tokens, max_blocks, run)), full

    def match(self, keys: Sequence[int]) -> dict[str, int]:
        """Per pod, how many leading blocks of the prompt it holds without a gap, weighed by tier
        (pods with none are absent); with speculative entries, the longer of the confirmed run and
        the predicted one (a prediction is a whole routed prompt from its first block, so the union
        of the two runs is the longer one, but for a confirmed run that resumes after a gap the
        prediction fills: not counted). Weighed, the predictions are one more tier at the default
        weight (llm-d's speculative entries carry no tier) and the run is over their union."""
        if not self.weights.plain or any(len(tier) for tier in self.offloaded.values()):
            scores, _ = self.weighted(keys)
            return {pod: n for pod, score in scores.items() if (n := whole_blocks(score)) > 0}
        counts = self.blocks.match_contiguous(keys)
        if self.speculative is not None and len(self.speculative):
            for pod, blocks in self.speculative.match(keys).items():
                if blocks > counts.get(pod, 0):
                    counts[pod] = blocks
        return counts

    def weighted(self, keys: Sequence[int]) -> tuple[dict[str, float], dict[str, int]]:
        """Per pod, its run's weighted score and its length in blocks, over every tier."""
        weights = self.weights
        tiers: list[tuple[Holders, float]] = [(self.blocks, weights.of(GPU_TIER))]
        tiers += [(tier, weights.of(name)) for name, tier in self.offloaded.items() if len(tier)]
        if self.speculative is not None and len(self.speculative):
            tiers.append((self.speculative, weights.default))
        return weighted_longest_prefix(keys, tiers)

    # -- pod status ----------------------------------------------------------------------------

    def status(self, pod: str) -> str:
        return self._status.get(pod, UNKNOWN)

    def statuses(self) -> dict[str, str]:
        return dict(self._status)

    def set_status(self, pod: str, status: str) -> None:
        self._status[pod] = status

    def set_capacity(self, pod: str, blocks: int) -> None:
        """Size a pod's entry (its KV cache in blocks); applies to a pod not yet indexed."""
        if blocks > 0 and pod not in self._engine:
            self._capacity[pod] = blocks

    def remove_pod(self, pod: str) -> None:
        """Forget a pod that left the pool: its blocks, names and status."""
        self.blocks.remove_server(pod)
        for tier in self.offloaded.values():
            tier.remove_server(pod)
        if self.speculative is not None:
            self.speculative.remove_pod(pod)
        self._engine.pop(pod, None)
        self._capacity.pop(pod, None)
        self._status.pop(pod, None)

    def pod_blocks(self, pod: str) -> int:
        """Blocks the pod holds on the GPU."""
        return self.blocks.server_size(pod)

    def offloaded_blocks(self, pod: str) -> dict[str, int]:
        """Blocks the pod holds in each other tier (tiers it holds none in are absent)."""
        return {name: n for name, tier in self.offloaded.items() if (n := tier.server_size(pod))}

    # -- the event side ------------------------------------------------------------------------

    def apply_batches(self, pod: str, batches: Iterable[object]) -> None:
        for batch in batches:
            self.counts.batches += 1
            self.apply(pod, getattr(batch, "events", ()))

    def apply(self, pod: str, events: Iterable[object]) -> None:
        """Apply one pod's events in order (vLLM's BlockStored, BlockRemoved, AllBlocksCleared)."""
        for event in events:
            kind = type(event).__name__
            try:
                if kind == "BlockStored":
                    self._stored(pod, event)
                elif kind == "BlockRemoved":
                    self._removed(pod, event)
                elif kind == "AllBlocksCleared":
                    self._cleared(pod)
                else:
                    self.counts.skipped += 1
            except (TypeError, ValueError, AttributeError, OverflowError):
                self.counts.skipped += 1  # a malformed event: skipped, the rest of the batch applies

    def _names(self, pod: str) -> OrderedDict[object, int]:
        names = self._engine.get(pod)
        if names is None:
            names = self._engine[pod] = OrderedDict()
        return names

    def _stored(self, pod: str, event: object) -> None:
        hashes = list(event.block_hashes)  # type: ignore[attr-defined]
        tier = tier_of(getattr(event, "medium", None))
        tokens = event.token_ids  # type: ignore[attr-defined]
        if tier != GPU_TIER and hashes and not tokens:  # blocks named only (vLLM's CPU offloading)
            self._located(pod, hashes, tier)
            return
        if event.block_size != self.block_size or not hashes:  # type: ignore[attr-defined]
            self.counts.skipped += 1
            return
        if len(tokens) < len(hashes) * self.block_size:
            self.counts.skipped += 1
            return
        names = self._names(pod)
        parent = event.parent_block_hash  # type: ignore[attr-defined]
        if parent is None:
            prev = ROOT_KEY
        else:
            prev = names.get(parent)
            if prev is None:  # its parent's store was never seen here: these keys can not be chained
                self.counts.skipped += 1
                return
        data = token_bytes(tokens[: len(hashes) * self.block_size])
        keys = chain_keys(data, prev, self.block_size * TOKEN_BYTES)
        for engine_hash, key in zip(hashes, keys, strict=True):
            names[engine_hash] = key
            names.move_to_end(engine_hash)
        self._index_keys(pod, keys, tier)

    def _located(self, pod: str, hashes: list[object], tier: str) -> None:
        """A store in another tier that names its blocks only: indexed by the keys of those names."""
        names = self._engine.get(pod)
        keys: list[int] = []
        for engine_hash in hashes:
            key = names.get(engine_hash) if names is not None else None
            if key is not None:
                keys.append(key)
                names.move_to_end(engine_hash)  # type: ignore[union-attr]
        if len(keys) < len(hashes):
            self.counts.skipped += 1  # names never stored here (or forgotten): those blocks are not indexed
        if keys:
            self._index_keys(pod, keys, tier)

    def _index_keys(self, pod: str, keys: list[int], tier: str) -> None:
        capacity = self._capacity.get(pod, self.default_capacity)
        if tier == GPU_TIER:
            self.blocks.add(keys, pod, capacity)
        else:
            index = self.offloaded.get(tier)
            if index is None:
                index = self.offloaded[tier] = PrefixIndex(self.default_capacity)
            index.add(keys, pod, max(capacity, self.default_capacity))
        names = self._engine[pod]
        bound = capacity + sum(t.server_capacity(pod) for t in self.offloaded.values())
        while len(names) > bound:
            names.popitem(last=False)
        self.counts.stored += len(keys)

    def _removed(self, pod: str, event: object) -> None:
        tier = tier_of(getattr(event, "medium", None))
        index = self.blocks if tier == GPU_TIER else self.offloaded.get(tier)
        names = self._engine.get(pod)
        tiered = bool(self.offloaded)  # a name lives while any tier of its pod holds its block
        keys: list[int] = []
        for engine_hash in event.block_hashes:  # type: ignore[attr-defined]
            key = (names.get(engine_hash) if tiered else names.pop(engine_hash, None)) if names is not None else None
            if key is None:
                self.counts.unknown_removed += 1
            else:
                keys.append(key)
        self.counts.removed += index.discard(keys, pod) if index is not None else 0
        if tiered and names is not None:
            for engine_hash in event.block_hashes:  # type: ignore[attr-defined]
                key = names.get(engine_hash)
                if key is not None and not self._held(pod, key):
                    del names[engine_hash]

    def _held(self, pod: str, key: int) -> bool:
        return self.blocks.holds(key, pod) or any(tier.holds(key, pod) for tier in self.offloaded.values())

    def _cleared(self, pod: str) -> None:
        self.blocks.remove_server(pod)
        for tier in self.offloaded.values():
            tier.remove_server(pod)
        names = self._engine.get(pod)
        if names is not None:
            names.clear()
        self.counts.cleared += 1
