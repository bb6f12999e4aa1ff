"""vLLM's msgpack wire format: our bytes decode with vLLM-shaped msgspec structs, theirs with ours."""

from __future__ import annotations

import msgspec
import pytest

from ray_epp.kvevents import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    WireError,
    decode_batch,
    encode_batch,
)


# The schema vLLM declares (vllm/distributed/kv_events.py): array-like, tagged, omit_defaults.
class _Event(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class _Stored(_Event, tag="BlockStored"):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list | None = None
    group_idx: int | None = None


class _Removed(_Event, tag="BlockRemoved"):
    block_hashes: list[int | bytes]
    medium: str | None
    group_idx: int | None = None


class _Cleared(_Event, tag="AllBlocksCleared"):
    pass


class _Batch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[_Stored | _Removed | _Cleared]
    data_parallel_rank: int | None = None


BATCH = KVEventBatch(
    ts=1764672000.25,
    events=[
        BlockStored([2**64 - 1, 7], None, list(range(32)), 16, lora_id=3, medium="GPU", lora_name="sql-lora"),
        BlockRemoved([5, 2**63]),
        AllBlocksCleared(),
    ],
    data_parallel_rank=0,
)


def test_our_bytes_are_vllms_bytes() -> None:
    theirs = _Batch(
        ts=BATCH.ts,
        events=[_Stored([2**64 - 1, 7], None, list(range(32)), 16, 3, "GPU", "sql-lora"), _Removed([5, 2**63], "GPU"),
                _Cleared()],
        data_parallel_rank=0,
    )
    assert encode_batch(BATCH) == msgspec.msgpack.encode(theirs)
    assert decode_batch(msgspec.msgpack.encode(theirs)) == BATCH
    assert msgspec.msgpack.decode(encode_batch(BATCH), type=_Batch) == theirs


def test_decodes_older_newer_and_map_layouts_and_byte_hashes() -> None:
    digest = bytes(range(32))
    old = msgspec.msgpack.encode([1.0, [["BlockStored", [1], 9, [1, 2], 2, None], ["BlockRemoved", [1]]]])
    b = decode_batch(old)
    assert b.events == [BlockStored([1], 9, [1, 2], 2, None, None, None), BlockRemoved([1], None)]
    assert encode_batch(b) != old  # we write every field, as current vLLM does
    assert b.data_parallel_rank is None
    newer = msgspec.msgpack.encode([2.0, [["BlockStored", [digest], None, [1, 2], 2, None, "GPU", None, [None], 0]]])
    ev = decode_batch(newer).events[0]
    assert ev.block_hashes == [int.from_bytes(digest[-8:], "big")] and ev.extra_keys == [None] and ev.group_idx == 0
    as_map = msgspec.msgpack.encode({"ts": 3.0, "events": [{"type": "BlockRemoved", "block_hashes": [4],
                                                             "medium": "GPU"}]})
    assert decode_batch(as_map).events == [BlockRemoved([4], "GPU")]


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\xc1",  # never-used msgpack byte
        b"not msgpack at all",
        msgspec.msgpack.encode(42),
        msgspec.msgpack.encode([1.0]),
        msgspec.msgpack.encode(["x", []]),
        msgspec.msgpack.encode([1.0, [["Nope"]]]),
        msgspec.msgpack.encode([1.0, [["BlockStored", [1], None]]]),
        msgspec.msgpack.encode([1.0, [["BlockStored", ["h"], None, [1], 1, None, None, None]]]),
        msgspec.msgpack.encode([1.0, [["BlockStored", [1], None, ["t"], 1, None, None, None]]]),
        msgspec.msgpack.encode([1.0, [["BlockStored", [1], None, [1], 0, None, None, None]]]),
        msgspec.msgpack.encode([1.0, [["BlockRemoved", 5]]]),
        msgspec.msgpack.encode([1.0, [7]]),
    ],
)
def test_garbage_is_one_clear_error(payload: bytes) -> None:
    with pytest.raises(WireError):
        decode_batch(payload)
