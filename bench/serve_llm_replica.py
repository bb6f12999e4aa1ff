"""A CPU stand-in for Ray Serve LLM's `LLMServer`, for testing and benchmarking request routers.

Same surface as LLMServer where routers see it: `chat(request)` and `completions(request)` take a
vLLM-shaped request (dict or pydantic) and LoRA adapters load through `@serve.multiplexed`. The
engine is a small model in real time: at most `max_running` requests run at once (the rest wait),
a request's prefill costs `prefill_s_per_block` per prompt block not in the replica's prefix
cache (an LRU of block hashes), then `decode_s_per_token` per output token. It publishes its
state through `record_routing_stats` (serve_app/llm_stats.py). Answers say which replica served,
its time to first token and how many prompt blocks hit the cache."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections import OrderedDict
from typing import Any

from ray import serve

from serve_app.llm_stats import EngineStatsMixin


def prompt_of(request: Any) -> tuple[str, int]:
    """(prompt text, max_tokens) of a completions or chat request, dict or pydantic."""
    data = request if isinstance(request, dict) else request.model_dump(exclude_none=True)
    messages = data.get("messages")
    text = json.dumps(messages, separators=(",", ":")) if messages is not None else str(data.get("prompt", ""))
    return text, int(data.get("max_tokens") or 1)


class FakeLLMServer(EngineStatsMixin):
    def __init__(
        self,
        max_running: int = 4,
        block_chars: int = 256,
        cache_blocks: int = 256,
        prefill_s_per_block: float = 0.002,
        decode_s_per_token: float = 0.001,
        overloaded_ranks: tuple[int, ...] | list[int] = (),
        max_lora: int = 2,
    ) -> None:
        ctx = serve.get_replica_context()
        self.replica = ctx.replica_id.unique_id
        self.rank = ctx.rank.rank if hasattr(ctx.rank, "rank") else int(ctx.rank)
        self.overloaded = self.rank in set(overloaded_ranks)
        self.epp_max_running = max_running
        self.epp_max_lora = max_lora
        self.block_chars = block_chars
        self.cache_blocks = cache_blocks
        self.prefill_s = prefill_s_per_block
        self.decode_s = decode_s_per_token
        self.cache: OrderedDict[bytes, None] = OrderedDict()
        self.slots = asyncio.Semaphore(max_running)
        self.loads = 0
        self.served = 0

    @serve.multiplexed(max_num_models_per_replica=2)
    async def load_lora(self, lora_id: str) -> str:
        self.loads += 1
        await asyncio.sleep(0.01)
        return lora_id

    def engine_state(self) -> dict[str, Any]:
        stats = super().engine_state()
        if self.overloaded:  # a replica whose engine is backed up (as its published state says)
            engine = stats["epp_engine"]
            engine["waiting"] += 50
            engine["kv_cache_usage"] = 0.97
        else:
            stats["epp_engine"]["kv_cache_usage"] = min(1.0, len(self.cache) / self.cache_blocks)
        return stats

    async def chat(self, request: Any) -> dict[str, Any]:
        return await self._run(request)

    async def completions(self, request: Any) -> dict[str, Any]:
        return await self._run(request)

    async def _run(self, request: Any) -> dict[str, Any]:
        text, max_tokens = prompt_of(request)
        lora = serve.get_multiplexed_model_id()
        if lora:
            await self.load_lora(lora)
        started = time.monotonic()
        with self.track_request(lora):
            async with self.slots:
                blocks = self._blocks(text)
                hits = 0
                for h in blocks:
                    if h not in self.cache:
                        break
                    hits += 1
                await asyncio.sleep(self.prefill_s * (len(blocks) - hits))
                ttft = time.monotonic() - started
                for h in blocks:
                    self.cache[h] = None
                    self.cache.move_to_end(h)
                while len(self.cache) > self.cache_blocks:
                    self.cache.popitem(last=False)
                await asyncio.sleep(self.decode_s * max_tokens)
        self.served += 1
        return {
            "replica": self.replica,
            "rank": self.rank,
            "lora": lora,
            "ttft_s": ttft,
            "prompt_blocks": len(blocks),
            "hit_blocks": hits,
            "choices": [{"index": 0, "text": "ok", "finish_reason": "length"}],
        }

    def _blocks(self, text: str) -> list[bytes]:
        out, h = [], hashlib.blake2b(digest_size=8)
        for i in range(0, len(text) - self.block_chars + 1, self.block_chars):
            h.update(text[i : i + self.block_chars].encode())
            out.append(h.copy().digest())
        return out

    async def whoami(self) -> dict[str, Any]:
        return {"replica": self.replica, "rank": self.rank, "loads": self.loads, "served": self.served}

    async def set_overloaded(self, value: bool) -> str:
        self.overloaded = value
        return self.replica


