"""Pieces every workload shares: Poisson arrivals, exact-length random text, request construction.

A workload is a list of `simulator.SimRequest` sorted by arrival time. Each carries its OpenAI body,
headers and priority, so the same list drives the cluster simulation and, later, an HTTP load
generator against a real gateway (the body is what it would POST at `arrival_time`)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from ray_epp.simulator import DEFAULT_MODEL, SimRequest
from ray_epp.simulator.workload import poisson_arrivals, random_text, zipf_weights

__all__ = [
    "DEFAULT_MODEL",
    "WorkloadUnavailable",
    "completion_request",
    "poisson_arrivals",
    "random_text",
    "random_words",
    "zipf_weights",
]


class WorkloadUnavailable(RuntimeError):
    """The workload's data is not installed (e.g. the optional ShareGPT package)."""


def completion_request(
    index: int,
    arrival: float,
    prompt: str,
    output_tokens: int,
    *,
    model: str = DEFAULT_MODEL,
    priority: int = 0,
    messages: list[dict[str, Any]] | None = None,
) -> SimRequest:
    """A request that generates exactly `output_tokens` tokens (ignore_eos), as benchmark clients send.

    With `messages` it is a chat completion (and `prompt` is ignored)."""
    body: dict[str, Any] = {"model": model, "max_tokens": output_tokens, "ignore_eos": True}
    if messages is not None:
        body["messages"] = messages
    else:
        body["prompt"] = prompt
    return SimRequest.from_body(f"req-{index}", arrival, body, priority=priority, output_tokens=output_tokens)


def random_words(rng: random.Random, words: Sequence[str], chars: int) -> str:
    """`chars` characters of words drawn at random, space-separated (the last one cut)."""
    out: list[str] = []
    n = 0
    while n < chars:
        w = rng.choice(words)
        out.append(w)
        n += len(w) + 1
    return " ".join(out)[:chars]


def seeded(seed: int, name: str) -> random.Random:
    """An RNG per (seed, purpose), so changing one part of a workload leaves the others alone."""
    return random.Random(f"{name}:{seed}")
