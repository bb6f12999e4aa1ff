"""vLLM's KV-cache events as plain slotted dataclasses (vllm/distributed/kv_events.py).

An engine with `--kv-events-config` publishes one `KVEventBatch` per engine step: the blocks it
stored (full blocks entering the prefix cache), the blocks it removed (evicted), or that it
cleared everything (a prefix-cache reset). Block hashes are the external form vLLM puts on the
wire: by default (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1`) the low 64 bits of the block's digest as
an unsigned int. `ray_epp.kvevents.wire` turns these into and out of vLLM's msgpack bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MEDIUM_GPU = "GPU"
MEDIUM_CPU = "CPU"  # vLLM's CPU offloading (the OffloadingConnector) publishes its tier under this


@dataclass(slots=True)
class BlockStored:
    """Full blocks that entered the cache, in chain order; `parent_block_hash` precedes the first."""

    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = MEDIUM_GPU
    lora_name: str | None = None
    extra_keys: list[Any] | None = None  # per block, what vLLM mixed into its hash (LoRA, salt, ...)
    group_idx: int | None = None  # the KV-cache group (hybrid models)


@dataclass(slots=True)
class BlockRemoved:
    """Blocks evicted from the cache (no longer findable by their hash)."""

    block_hashes: list[int]
    medium: str | None = MEDIUM_GPU
    group_idx: int | None = None


@dataclass(slots=True)
class AllBlocksCleared:
    """Every cached block is gone (prefix-cache reset, or a restarted engine)."""


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(slots=True)
class KVEventBatch:
    """One engine step's events; `ts` is the publisher's wall-clock time in seconds."""

    ts: float
    events: list[KVEvent] = field(default_factory=list)
    data_parallel_rank: int | None = None
