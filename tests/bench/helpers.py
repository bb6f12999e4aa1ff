"""Hand-made pods and requests for the policy tests."""

from __future__ import annotations

from typing import Any

from ray_epp.simulator import DEFAULT_MODEL, PodView, SimRequest


def pods(*names: str, role: str = "both", **metrics: Any) -> list[PodView]:
    base = {
        "waiting_queue_size": 0,
        "running_requests_size": 0,
        "kv_cache_usage_percent": 0.0,
        "active_models": [],
        "waiting_models": [],
        "max_active_models": 4,
        "cache_block_size": 16,
        "cache_num_gpu_blocks": 27000,
    }
    return [PodView(n, {"llm-d.ai/role": role}, {**base, **metrics}) for n in names]


def req(rid: str, prompt: str, model: str = DEFAULT_MODEL, priority: int = 0, t: float = 0.0) -> SimRequest:
    body = {"model": model, "prompt": prompt, "max_tokens": 8, "ignore_eos": True}
    return SimRequest.from_body(rid, t, body, priority=priority, output_tokens=8)


SYSTEM = "You are a careful assistant. " * 40  # ~1,100 characters
