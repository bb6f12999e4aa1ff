"""Random-prompt workloads: uniform (the control), multi-LoRA, and mixed priority.

All three draw a unique random prompt of `prompt_tokens` (uniform, inclusive) and an exact output
length of `output_tokens` (uniform, inclusive) per request — the simulator's WorkloadSpec ranges
(128-1,024 in, 16-256 out) — with Poisson arrivals. No two prompts share a prefix, so routing has
nothing to gain from cache affinity."""

from __future__ import annotations

from dataclasses import dataclass

from bench.workloads.common import (
    DEFAULT_MODEL,
    completion_request,
    poisson_arrivals,
    random_text,
    seeded,
    zipf_weights,
)
from ray_epp.simulator import SimRequest

CRITICAL, SHEDDABLE = 1, -1


@dataclass(frozen=True, slots=True)
class RandomPromptSpec:
    num_requests: int = 2000
    prompt_tokens: tuple[int, int] = (128, 1024)
    output_tokens: tuple[int, int] = (16, 256)
    # Multi-LoRA: requests addressed to `adapters` with zipf(`adapter_zipf`) popularity (first most popular).
    adapters: tuple[str, ...] = ()
    adapter_fraction: float = 1.0
    adapter_zipf: float = 1.0
    # Mixed priority: this share is critical (priority 1), the rest sheddable (priority -1).
    critical_fraction: float | None = None
    model: str = DEFAULT_MODEL


LORA_ADAPTERS = tuple(f"lora-{i:02d}" for i in range(15))


def uniform_spec(num_requests: int = 2000) -> RandomPromptSpec:
    return RandomPromptSpec(num_requests=num_requests)


def multi_lora_spec(num_requests: int = 2000) -> RandomPromptSpec:
    """15 adapters, zipf(1.0) popularity: the top adapter gets ~30% of requests, the last ~2%."""
    return RandomPromptSpec(num_requests=num_requests, adapters=LORA_ADAPTERS)


def mixed_priority_spec(num_requests: int = 2000) -> RandomPromptSpec:
    """Half critical, half sheddable."""
    return RandomPromptSpec(num_requests=num_requests, critical_fraction=0.5)


def random_prompt_workload(spec: RandomPromptSpec, rate: float, seed: int = 0) -> list[SimRequest]:
    """`spec.num_requests` requests at Poisson `rate` (<= 0: all at t=0)."""
    rng = seeded(seed, "random-prompts")
    pick = seeded(seed, "choices")
    weights = zipf_weights(len(spec.adapters), spec.adapter_zipf)
    times = poisson_arrivals(seeded(seed, "arrivals"), spec.num_requests, rate)
    out: list[SimRequest] = []
    for i, t in enumerate(times):
        prompt = random_text(rng, rng.randint(*spec.prompt_tokens))
        n_out = rng.randint(*spec.output_tokens)
        model = spec.model
        if spec.adapters and pick.random() < spec.adapter_fraction:
            model = pick.choices(spec.adapters, weights)[0]
        priority = 0
        if spec.critical_fraction is not None:
            priority = CRITICAL if pick.random() < spec.critical_fraction else SHEDDABLE
        out.append(completion_request(i, t, prompt, n_out, model=model, priority=priority))
    return out
