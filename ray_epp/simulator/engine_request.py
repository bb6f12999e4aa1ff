"""One request inside a simulated engine, and the states it moves through: the engine's unit of
work, shared by the engine, its drivers (HTTP, cluster simulation) and the metrics they report."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

WAITING, TRANSFERRING, RUNNING, FINISHED, ABORTED = range(5)


@dataclass(slots=True, eq=False)
class EngineRequest:
    """One request inside an engine; times are in the driver's seconds."""

    request_id: str
    prompt_tokens: int
    max_tokens: int
    output_len: int  # tokens this request will generate (<= max_tokens)
    block_hashes: list[int]
    arrival: float
    lora: str | None = None
    remote_prefill: bool = False  # P/D decode side: the prompt's KV is pulled from a prefill pod
    remote_decode: bool = False  # P/D prefill side: stop after prefill and hand the KV over
    sink: Any = None  # the driver's per-request state
    token_ids: list[int] | None = None  # kept only while KV events are on (BlockStored carries them)
    state: int = WAITING
    prefill_len: int = 0  # tokens to compute before decoding (prompt, or prompt + output after preemption)
    num_computed: int = 0
    num_output: int = 0
    blocks: list[int] = field(default_factory=list)
    n_hashed: int = 0
    num_cached_tokens: int = -1  # prompt tokens not computed here (prefix hits or pulled KV)
    first_scheduled: float = -1.0
    first_token_time: float = -1.0
    finish_time: float = -1.0
    ready_time: float = 0.0
    sched_tokens: int = 0
    finish_reason: str = ""
    preemptions: int = 0
    lora_loaded: bool = False
    kv_blocks_out: list[int] | None = None
