"""A small, seeded workload generator for the cluster simulation.

Poisson arrivals; prompts made of an optional shared prefix (one of `prefix_groups` system prompts,
chosen with a zipf-ish popularity) plus a unique random suffix; output lengths uniform in a range;
a share of requests addressed to LoRA adapters with zipf-ish popularity. Text is random hex, exactly
CHARS_PER_TOKEN characters per token, so token counts are exact under the simulator's approximation.
The same seed gives the same workload.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from ray_epp.simulator.config import DEFAULT_MODEL
from ray_epp.simulator.routing import SimRequest
from ray_epp.simulator.tokens import CHARS_PER_TOKEN


@dataclass(slots=True)
class WorkloadSpec:
    num_requests: int = 1000
    rate: float = 10.0  # mean arrivals per second (Poisson); <= 0 means all at t=0
    prompt_tokens: tuple[int, int] = (128, 1024)  # unique part, uniform inclusive range
    output_tokens: tuple[int, int] = (16, 256)  # uniform inclusive range, generated exactly (ignore_eos)
    prefix_groups: int = 0  # number of shared prefixes; 0 = no shared prefixes
    prefix_tokens: int = 1024  # length of each shared prefix
    prefix_fraction: float = 1.0  # share of requests that start with a shared prefix
    prefix_zipf: float = 0.0  # popularity skew of the groups (0 = uniform)
    lora_adapters: list[str] = field(default_factory=list)
    lora_fraction: float = 0.0  # share of requests addressed to an adapter
    lora_zipf: float = 1.0
    chat: bool = False
    model: str = DEFAULT_MODEL
    priority: int = 0
    seed: int = 0


def random_text(rng: random.Random, tokens: int) -> str:
    """Exactly `tokens` tokens of random text (hex: fast and collision-free)."""
    return rng.randbytes(tokens * CHARS_PER_TOKEN // 2).hex()


def zipf_weights(n: int, s: float) -> list[float]:
    return [1.0 / (i + 1) ** s for i in range(n)]


def poisson_arrivals(rng: random.Random, n: int, rate: float, start: float = 0.0) -> list[float]:
    if rate <= 0:
        return [start] * n
    out, t = [], start
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def generate_workload(spec: WorkloadSpec | None = None, **overrides: object) -> list[SimRequest]:
    """Requests for `spec` (fields can be overridden by keyword), sorted by arrival time."""
    spec = spec or WorkloadSpec()
    for k, v in overrides.items():
        setattr(spec, k, v)
    rng = random.Random(spec.seed)
    prefixes = [random_text(rng, spec.prefix_tokens) for _ in range(spec.prefix_groups)]
    prefix_w = zipf_weights(len(prefixes), spec.prefix_zipf)
    lora_w = zipf_weights(len(spec.lora_adapters), spec.lora_zipf)
    out: list[SimRequest] = []
    for i, t in enumerate(poisson_arrivals(rng, spec.num_requests, spec.rate)):
        prefix = ""
        if prefixes and rng.random() < spec.prefix_fraction:
            prefix = rng.choices(prefixes, prefix_w)[0]
        suffix = random_text(rng, rng.randint(*spec.prompt_tokens))
        n_out = rng.randint(*spec.output_tokens)
        model = spec.model
        if spec.lora_adapters and rng.random() < spec.lora_fraction:
            model = rng.choices(spec.lora_adapters, lora_w)[0]
        body: dict[str, object] = {"model": model, "max_tokens": n_out, "ignore_eos": True}
        if spec.chat:
            msgs = [{"role": "system", "content": prefix}] if prefix else []
            body["messages"] = [*msgs, {"role": "user", "content": suffix}]
        else:
            body["prompt"] = prefix + suffix
        out.append(SimRequest.from_body(f"req-{i}", t, body, priority=spec.priority, output_tokens=n_out))
    return out
