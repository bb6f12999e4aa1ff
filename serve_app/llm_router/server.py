"""`EPPLLMServer`: Ray Serve LLM's `LLMServer` publishing its load to `EPPRequestRouter`.

A plain `LLMServer` publishes only what Ray's KV-aware routing needs, so EPPRequestRouter sees it
through Serve's queue-length cache (its ongoing requests) and its multiplexed LoRA ids. This
subclass adds the engine state of `serve_app/llm_router/stats.py` to its `record_routing_stats`: the
requests it runs (waiting beyond the engine's `max_num_seqs`), the LoRA adapters they use, the
engine's LoRA slots and block size. (vLLM's own KV-cache use is not exposed to the replica by
Ray Serve LLM 2.60 without reaching into its engine client; it stays 0 here.)

Importing this module needs no `ray[llm]`: the class is built on first access, so
`LLMConfig(server_cls="serve_app.llm_router.server:EPPLLMServer")` and Serve config files can name it.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from typing import Any

from serve_app.llm_router.stats import EngineStatsMixin

__all__ = ["epp_llm_server_class", "tracked"]  # and EPPLLMServer, built on first access


async def tracked(owner: EngineStatsMixin, stream: Any, lora_id: str) -> AsyncIterator[Any]:
    """`stream` (an async iterator of responses) counted as one running request of `owner` while
    it is consumed."""
    with owner.track_request(lora_id):
        async for item in stream:
            yield item


@functools.cache
def epp_llm_server_class() -> type:
    """The LLMServer subclass (imports ray.serve.llm: needs `ray[llm]`)."""
    from ray import serve

    try:
        from ray.serve.llm import LLMServer
    except ImportError as err:
        raise ImportError(f"EPPLLMServer needs Ray Serve LLM (pip install 'ray[llm]'): {err}") from err

    class EPPLLMServer(LLMServer, EngineStatsMixin):
        """LLMServer + EngineStatsMixin: Ray Serve LLM's server, publishing its load for EPP."""

        async def __init__(self, llm_config: Any, **kwargs: Any) -> None:
            engine = dict(llm_config.engine_kwargs or {})
            self.epp_max_running = int(engine.get("max_num_seqs", 0) or 0)
            self.epp_max_lora = int(engine.get("max_loras", 1 if llm_config.lora_config else 0) or 0)
            self.epp_block_size = int(engine.get("block_size", 16) or 16)
            await super().__init__(llm_config, **kwargs)

        async def chat(self, request: Any, raw_request_info: Any = None) -> Any:
            stream = await super().chat(request, raw_request_info)
            return tracked(self, stream, serve.get_multiplexed_model_id())

        async def completions(self, request: Any, raw_request_info: Any = None) -> Any:
            stream = await super().completions(request, raw_request_info)
            return tracked(self, stream, serve.get_multiplexed_model_id())

        async def record_routing_stats(self) -> dict[str, Any]:
            return {**(await LLMServer.record_routing_stats(self)), **self.engine_state()}

    EPPLLMServer.__module__, EPPLLMServer.__qualname__ = __name__, "EPPLLMServer"  # pickled by name
    return EPPLLMServer


def __getattr__(name: str) -> Any:
    if name == "EPPLLMServer":
        return epp_llm_server_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
