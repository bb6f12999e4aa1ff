"""Shared helpers for the simulator tests."""

from __future__ import annotations

import json
import time
from typing import Any

import aiohttp

from ray_epp.simulator import DEFAULT_MODEL, ClusterSim, PodConfig, SimRequest


def text_tokens(tokens: int, seed: str = "x") -> str:
    """A prompt of exactly `tokens` tokens (4 characters each) that differs per seed."""
    unit = (seed * 4)[:4]
    return "".join(f"{unit[:2]}{i % 100:02d}" for i in range(tokens))


def completion(prompt: str, max_tokens: int = 4, model: str = DEFAULT_MODEL, **extra: Any) -> dict[str, Any]:
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, **extra}


def sim_request(rid: str, t: float, prompt: str, max_tokens: int = 4, model: str = DEFAULT_MODEL) -> SimRequest:
    return SimRequest.from_body(rid, t, completion(prompt, max_tokens, model, ignore_eos=True))


def to_first(pod: str):
    """A router that sends everything to one pod."""
    return lambda request, pods, now: pod


def run_one_pod(cfg: PodConfig, requests: list[SimRequest], **kw: Any) -> dict[str, Any]:
    """Run requests on a single pod in virtual time; results by request id."""
    report = ClusterSim([cfg], to_first(cfg.name), **kw).run(requests)
    return {r.request_id: r for r in report.results}


async def stream_ttft(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """(seconds to the first content chunk, usage) of a streamed completion."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first = None
    usage: dict[str, Any] = {}
    async with session.post(url + "/v1/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk["choices"] and first is None:
                first = time.perf_counter() - t0
            if chunk.get("usage"):
                usage = chunk["usage"]
    assert first is not None
    return first, usage
