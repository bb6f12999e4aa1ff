"""vLLM's KV-event wire format: msgpack, as vLLM's msgspec structs encode it.

vLLM declares `EventBatch` and its tagged `KVCacheEvent` structs `array_like=True, tag=True`, and
msgspec writes every field of an array-like struct (defaults too): a batch is the array
`[ts, [event, ...], data_parallel_rank]` and an event the array `["BlockStored", block_hashes,
parent_block_hash, token_ids, block_size, lora_id, medium, lora_name, extra_keys, group_idx]`,
`["BlockRemoved", block_hashes, medium, group_idx]` or `["AllBlocksCleared"]`, which is what
`encode_batch` writes. Older engines send fewer fields (no `medium`, `lora_name`, `extra_keys`,
`group_idx`); newer ones may append more (`kv_cache_spec_kind`, ...) or use msgspec's map layout
(`{"type": "BlockStored", ...}`). The decoder takes all of these and keeps the fields in
`ray_epp.kvevents.events`. A block hash may arrive as an int (the default) or as the digest's bytes
(`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0`); bytes are folded to the same int vLLM would have sent.

Anything else is a `WireError`: one type, so a subscriber counts it and moves on.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ray_epp.kvevents.block_hash import external_hash
from ray_epp.kvevents.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent, KVEventBatch

_ENCODER = msgspec.msgpack.Encoder()
_STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name",
                  "extra_keys", "group_idx")
_REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")


class WireError(ValueError):
    """Bytes that are not a vLLM KVEventBatch."""


def _event_array(ev: KVEvent) -> list[Any]:
    if isinstance(ev, BlockStored):
        out: list[Any] = ["BlockStored", ev.block_hashes, ev.parent_block_hash, ev.token_ids, ev.block_size,
                          ev.lora_id, ev.medium, ev.lora_name, ev.extra_keys, ev.group_idx]
    elif isinstance(ev, BlockRemoved):
        out = ["BlockRemoved", ev.block_hashes, ev.medium, ev.group_idx]
    elif isinstance(ev, AllBlocksCleared):
        out = ["AllBlocksCleared"]
    else:
        raise TypeError(f"not a KV event: {type(ev).__name__}")
    return out


def encode_batch(batch: KVEventBatch) -> bytes:
    """The bytes vLLM's publisher sends for this batch."""
    return _ENCODER.encode([batch.ts, [_event_array(e) for e in batch.events], batch.data_parallel_rank])


def _hash(v: Any, what: str) -> int:
    if isinstance(v, int) and not isinstance(v, bool):
        if v < 0:
            # a signed form of the same 64 bits (some encoders); keep the unsigned name
            v &= (1 << 64) - 1
        return v
    if isinstance(v, bytes | bytearray):
        return external_hash(bytes(v))
    raise WireError(f"{what}: a block hash must be an int or bytes, got {type(v).__name__}")


def _hashes(v: Any, what: str) -> list[int]:
    if not isinstance(v, list):
        raise WireError(f"{what}: block_hashes must be a list, got {type(v).__name__}")
    return [_hash(h, what) for h in v]


def _opt_int(v: Any, what: str) -> int | None:
    if v is None or (isinstance(v, int) and not isinstance(v, bool)):
        return v
    raise WireError(f"{what}: expected an int or nil, got {type(v).__name__}")


def _opt_str(v: Any, what: str) -> str | None:
    if v is None or isinstance(v, str):
        return v
    raise WireError(f"{what}: expected a string or nil, got {type(v).__name__}")


def _opt_list(v: Any, what: str) -> list[Any] | None:
    if v is None or isinstance(v, list):
        return v
    raise WireError(f"{what}: expected a list or nil, got {type(v).__name__}")


def _fields(raw: Any, names: tuple[str, ...], required: int, tag: str) -> dict[str, Any]:
    """An event's fields by name, from the array layout (after the tag) or the map layout."""
    if isinstance(raw, list):
        values = raw[1:]
        if len(values) < required:
            raise WireError(f"{tag}: {len(values)} fields, at least {required} expected")
        return dict(zip(names, values, strict=False))
    return {k: raw.get(k) for k in names if k in raw}


def _event(raw: Any) -> KVEvent:
    if isinstance(raw, list) and raw:
        tag = raw[0]
    elif isinstance(raw, dict):
        tag = raw.get("type")
    else:
        raise WireError(f"an event must be a tagged array or map, got {type(raw).__name__}")
    if tag == "BlockStored":
        f = _fields(raw, _STORED_FIELDS, 4, tag)
        parent = f.get("parent_block_hash")
        tokens = f.get("token_ids")
        size = f.get("block_size")
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise WireError("BlockStored: token_ids must be a list of ints")
        if not isinstance(size, int) or size <= 0:
            raise WireError(f"BlockStored: block_size must be a positive int, got {size!r}")
        return BlockStored(
            block_hashes=_hashes(f.get("block_hashes"), tag),
            parent_block_hash=None if parent is None else _hash(parent, tag),
            token_ids=tokens,
            block_size=size,
            lora_id=_opt_int(f.get("lora_id"), tag),
            medium=_opt_str(f.get("medium"), tag),
            lora_name=_opt_str(f.get("lora_name"), tag),
            extra_keys=_opt_list(f.get("extra_keys"), tag),
            group_idx=_opt_int(f.get("group_idx"), tag),
        )
    if tag == "BlockRemoved":
        f = _fields(raw, _REMOVED_FIELDS, 1, tag)
        return BlockRemoved(block_hashes=_hashes(f.get("block_hashes"), tag), medium=_opt_str(f.get("medium"), tag),
                            group_idx=_opt_int(f.get("group_idx"), tag))
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    raise WireError(f"unknown event tag {tag!r}")


def decode_batch(payload: bytes) -> KVEventBatch:
    """The batch in a publisher's payload frame; `WireError` for anything that is not one."""
    try:
        raw = msgspec.msgpack.decode(payload)
    except (msgspec.DecodeError, TypeError, ValueError) as e:
        raise WireError(f"not msgpack: {e}") from None
    if isinstance(raw, dict):  # the map layout of EventBatch
        ts, events, rank = raw.get("ts"), raw.get("events"), raw.get("data_parallel_rank")
    elif isinstance(raw, list) and len(raw) >= 2:
        ts, events = raw[0], raw[1]
        rank = raw[2] if len(raw) > 2 else None
    else:
        raise WireError(f"a batch must be [ts, events, rank?], got {type(raw).__name__}")
    if not isinstance(ts, int | float) or isinstance(ts, bool):
        raise WireError(f"batch ts must be a number, got {type(ts).__name__}")
    if not isinstance(events, list):
        raise WireError(f"batch events must be a list, got {type(events).__name__}")
    return KVEventBatch(ts=float(ts), events=[_event(e) for e in events], data_parallel_rank=_opt_int(rank, "batch"))
