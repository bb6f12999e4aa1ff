"""Dynamo's selection core as both Dynamo peers use it: the cluster simulation's router
(bench/policies/dynamo.py) and the end-to-end forwarder (bench/dynamo_forwarder.py).

`SelectionService` is ai-dynamo-runtime's in-process handle on the Rust selection core behind
`python -m dynamo.frontend --router-mode kv` (no etcd, NATS or request plane): a KV indexer that
subscribes to each worker's vLLM KV events over ZMQ, an active-sequence tracker, and the cost
function. Needs `pip install --no-deps ai-dynamo-runtime==1.6.1` (its pydantic pin is older than
this project's; the selection core does not use pydantic); without it `DynamoUnavailable`."""

from __future__ import annotations

import os
from typing import Any

MODEL = "sim"  # the catalog's model name: one model per service here
BLOCK_SIZE = 16  # the simulated pods' (vLLM's default)
U32 = 0xFFFF_FFFF
INSTALL = "pip install --no-deps ai-dynamo-runtime==1.6.1"


class DynamoUnavailable(RuntimeError):
    pass


def selection_service() -> Any:
    """A fresh `SelectionService` with one indexer thread (the machine has 2 cores)."""
    os.environ.setdefault("DYN_LOG", "warn")  # its per-decision INFO lines cost more than the decision
    try:
        from dynamo._core import SelectionService
    except ImportError as err:  # pragma: no cover - depends on the optional install
        raise DynamoUnavailable(f"the dynamo-kv policy runs Dynamo's own selection core: {INSTALL}") from err
    return SelectionService(indexer_threads=1)


def worker_record(worker_id: int, url: str, kv_events: str, replay: str | None) -> dict[str, Any]:
    """The catalog entry `upsert_worker` takes: the service subscribes to `kv_events` (and asks
    `replay` for what it missed)."""
    record: dict[str, Any] = {
        "worker_id": worker_id,
        "model_name": MODEL,
        "block_size": BLOCK_SIZE,
        "endpoint": url,
        "kv_events_endpoint": kv_events,
    }
    if replay:
        record["replay_endpoint"] = replay
    return record


def selection_request(request_id: str, tokens: list[int]) -> dict[str, Any]:
    """`select_and_reserve`'s body: book the request under its own id."""
    return {"model_name": MODEL, "token_ids": u32(tokens), "selection_id": request_id}


def u32(ids: list[int]) -> list[int]:
    """Dynamo's token ids are u32; the simulator's id for a non-ASCII chunk is 2**32 + a CRC."""
    return ids if all(t <= U32 for t in ids) else [t & U32 for t in ids]
