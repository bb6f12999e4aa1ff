"""A CPU stand-in for Ray Serve LLM's `LLMServer`, for testing and benchmarking request routers.

Same surface as LLMServer where routers see it: `chat(request)` and `completions(request)` take a
vLLM-shaped request (dict or pydantic) and LoRA adapters load through `@serve.multiplexed`. The
engine is the simulator's (ray_epp/simulator/engine.py: continuous batching, a paged KV cache with prefix
caching, LoRA slots) running in real time behind its own vLLM-shaped HTTP server on 127.0.0.1
(`SimPod`), as vLLM runs inside an LLMServer replica; the replica forwards each request to it and
publishes the engine's state through `record_routing_stats` (serve_app/llm_router/stats.py). The pod's
`/metrics` page is vLLM's, and its URL is in the replica's metadata (`METRICS_URL_KEY`).

Answers say which replica served, the time to first token inside the replica (`ttft_s`), the time
from the first token to the end (`tail_s`: a caller's own TTFT is its latency minus this), and the
prompt tokens the prefix cache served (`cached_tokens`, `hit_blocks`)."""

from __future__ import annotations

import json
import time
from typing import Any

import aiohttp
from pydantic import BaseModel, ConfigDict
from ray import serve

from ray_epp.simulator import DEFAULT_MODEL, PodConfig, SimPod
from serve_app.llm_router.stats import METRICS_URL_KEY, EngineStatsMixin, engine_routing_stats

MAX_LORAS = 4  # LoRA slots on the engine and adapters a replica keeps loaded (Serve's multiplex LRU)


class CompletionRequest(BaseModel):
    """vLLM's CompletionRequest where routers read it (attributes, not dict keys: ray.llm's
    PrefixCacheAffinityRouter reads `.prompt` / `.messages`); other fields ride along."""

    model_config = ConfigDict(extra="allow")
    model: str = DEFAULT_MODEL
    prompt: str | list[int] = ""
    max_tokens: int | None = None


class ChatCompletionRequest(BaseModel):
    """vLLM's ChatCompletionRequest where routers read it."""

    model_config = ConfigDict(extra="allow")
    model: str = DEFAULT_MODEL
    messages: list[dict[str, Any]] = []
    max_tokens: int | None = None


def request_model(body: dict[str, Any]) -> CompletionRequest | ChatCompletionRequest:
    """An OpenAI body as the pydantic request LLMServer's handle methods take."""
    return (ChatCompletionRequest if "messages" in body else CompletionRequest).model_validate(body)


def body_of(request: Any) -> dict[str, Any]:
    """A completions or chat request as a dict, from a dict or a pydantic request."""
    return dict(request) if isinstance(request, dict) else request.model_dump(exclude_none=True)


class FakeLLMServer(EngineStatsMixin):
    async def __init__(
        self,
        pod: dict[str, Any] | None = None,
        overloaded_ranks: tuple[int, ...] | list[int] = (),
        time_scale: float = 1.0,
        publish_stats: bool = True,
    ) -> None:
        """`pod`: simulator `PodConfig` fields (defaults: an 8B-class model on one H100);
        `overloaded_ranks`: replicas whose published state says they are backed up;
        `publish_stats=False`: publish nothing (a router then sees the engine only by its /metrics)."""
        ctx = serve.get_replica_context()
        self.replica = ctx.replica_id.unique_id
        self.rank = ctx.rank.rank if hasattr(ctx.rank, "rank") else int(ctx.rank)
        self.overloaded = self.rank in set(overloaded_ranks)
        self.publish_stats = publish_stats
        cfg = PodConfig.model_validate({"max_loras": MAX_LORAS, **(pod or {}), "name": f"replica-{self.rank}"})
        self.pod = SimPod(cfg, time_scale=time_scale, seed=self.rank)
        await self.pod.start()
        self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600))
        self.loads = 0
        self.served = 0

    def record_replica_metadata(self) -> dict[str, Any]:
        """Static per replica (Serve calls it once): where the engine's /metrics page is."""
        return {METRICS_URL_KEY: f"{self.pod.url}/metrics"}

    @serve.multiplexed(max_num_models_per_replica=MAX_LORAS)
    async def load_lora(self, lora_id: str) -> str:
        """Serve's multiplexed loader: register the adapter with the engine (as LLMServer does with
        vLLM's load_lora_adapter); the engine activates it on its first request."""
        self.loads += 1
        if lora_id not in self.pod.engine.adapters:
            async with self.http.post(f"{self.pod.url}/v1/load_lora_adapter", json={"lora_name": lora_id}) as r:
                r.raise_for_status()
        return lora_id

    def engine_state(self) -> dict[str, Any]:
        if not self.publish_stats:
            return {}
        e = self.pod.engine
        waiting = len(e.waiting) + len(e.transferring)
        kv = e.kv.usage()
        if self.overloaded:  # a replica whose engine is backed up (as its published state says)
            waiting, kv = waiting + 50, 0.97
        return engine_routing_stats(
            waiting=waiting,
            running=len(e.running),
            kv_cache_usage=kv,
            running_lora_adapters=e.lora.running_adapters(),
            waiting_lora_adapters=e.waiting_adapters(),
            max_lora=e.lora.max_loras,
            block_size=e.block_size,
            num_blocks=e.kv.num_blocks,
        )

    async def chat(self, request: Any) -> dict[str, Any]:
        return await self._run(request, "/v1/chat/completions")

    async def completions(self, request: Any) -> dict[str, Any]:
        return await self._run(request, "/v1/completions")

    async def _run(self, request: Any, path: str) -> dict[str, Any]:
        received = time.time()  # wall clock: the caller's router stamps its steps in it too
        internal_id = serve.context._get_serve_request_context()._internal_request_id
        body = body_of(request)
        lora = serve.get_multiplexed_model_id()
        if lora:
            await self.load_lora(lora)
        body.update(model=lora or self.pod.cfg.model, stream=True, stream_options={"include_usage": True})
        started, started_wall = time.monotonic(), time.time()
        first = 0.0
        usage: dict[str, Any] = {}
        async with self.http.post(f"{self.pod.url}{path}", json=body) as response:
            if response.status != 200:
                raise RuntimeError(f"engine answered {response.status}: {await response.text()}")
            async for line in response.content:
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("choices") and not first:
                    first = time.monotonic()
                usage = chunk.get("usage") or usage
        done = time.monotonic()
        self.served += 1
        cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0))
        return {
            "replica": self.replica,
            "rank": self.rank,
            "lora": lora,
            "engine_start": started,  # time.monotonic(): one clock for every process on the machine
            "received_wall": received,
            "prep_s": started_wall - received,  # in the replica before the engine call (LoRA load)
            "internal_request_id": internal_id,
            "ttft_s": (first or done) - started,
            "tail_s": done - (first or done),
            "prompt_tokens": int(usage.get("prompt_tokens", 0)),
            "cached_tokens": cached,
            "hit_blocks": cached // self.pod.engine.block_size,
            "choices": [{"index": 0, "text": "ok", "finish_reason": "length"}],
        }

    async def whoami(self) -> dict[str, Any]:
        return {"replica": self.replica, "rank": self.rank, "loads": self.loads, "served": self.served}

    async def set_overloaded(self, value: bool) -> str:
        self.overloaded = value
        return self.replica

    async def __del__(self) -> None:
        await self.http.close()
        await self.pod.stop()


__all__ = ["METRICS_URL_KEY", "ChatCompletionRequest", "CompletionRequest", "FakeLLMServer", "request_model"]
