"""Shared-prefix workloads: groups of requests that share a long system prompt.

* `SGLANG_GSP` — SGLang's `bench_serving --dataset-name generated-shared-prefix` defaults:
  64 groups x 16 prompts, a 2,048-token system prompt, a 128-token question, 256 output tokens.
  As in SGLang's generator the prompts are made group by group and then shuffled. A run that needs
  more than the 1,024 requests keeps the 64 system prompts and gives every group more questions
  (`mode="fresh"`): the same 64 "applications" under longer traffic.
* `LLMD_SHARED_PREFIX` — llm-d's published prefix-cache benchmark shape (inference-perf's
  shared_prefix data): 150 groups x 5 prompts, 6,000-token system prompt, 1,200-token question,
  1,000 output tokens; a run draws its requests from those 750 prompts at random with replacement
  (`mode="sample"`), as a load generator cycling through a fixed prompt set does. Every length is
  scaled by `LLMD_SCALE` (0.5: 3,000 / 600 / 500): unscaled, a request (7,200 + 1,000 tokens) does
  not fit the simulated pod's max_model_len of 8,192; halved, the shape (the prefix is 5/6 of the
  prompt, the output 1/6 of it) is kept and a run takes seconds.
* `CACHE_PRESSURE` — prefixes that do not fit: 384 groups x 4 prompts, a 2,048-token system prompt,
  a 128-token question, 128 output tokens, drawn at random (`mode="sample"`), for pods of
  `CACHE_PRESSURE_POD_BLOCKS` (2,048) blocks of 16 tokens. The system prompts total 786,432
  tokens, 3x the 8-pod pool's 262,144 tokens of KV cache, so pods evict all the time and an index
  that remembers where it sent a prefix is often wrong about what a pod still holds."""

from __future__ import annotations

from dataclasses import dataclass

from bench.workloads.common import completion_request, poisson_arrivals, random_text, seeded
from ray_epp.simulator import SimRequest

LLMD_SCALE = 0.5


@dataclass(frozen=True, slots=True)
class SharedPrefixSpec:
    groups: int
    prompts_per_group: int
    system_tokens: int
    question_tokens: int
    output_tokens: int
    scale: float = 1.0  # applied to the three token lengths
    mode: str = "fresh"  # longer runs: "fresh" questions per group, or "sample" the fixed prompt set

    def tokens(self, n: int) -> int:
        return max(1, round(n * self.scale))

    @property
    def num_requests(self) -> int:
        return self.groups * self.prompts_per_group


SGLANG_GSP = SharedPrefixSpec(
    groups=64, prompts_per_group=16, system_tokens=2048, question_tokens=128, output_tokens=256
)
CACHE_PRESSURE = SharedPrefixSpec(
    groups=384, prompts_per_group=4, system_tokens=2048, question_tokens=128, output_tokens=128, mode="sample"
)
CACHE_PRESSURE_POD_BLOCKS = 2048


def prefix_to_cache_ratio(spec: SharedPrefixSpec, pods: int, blocks_per_pod: int, block_size: int = 16) -> float:
    """The distinct system-prompt tokens over the pool's KV-cache tokens."""
    return spec.groups * spec.tokens(spec.system_tokens) / (pods * blocks_per_pod * block_size)


LLMD_SHARED_PREFIX = SharedPrefixSpec(
    groups=150,
    prompts_per_group=5,
    system_tokens=6000,
    question_tokens=1200,
    output_tokens=1000,
    scale=LLMD_SCALE,
    mode="sample",
)


def shared_prefix_workload(
    spec: SharedPrefixSpec, rate: float, seed: int = 0, num_requests: int | None = None
) -> list[SimRequest]:
    """`num_requests` (default: the spec's groups x prompts, each once) at Poisson `rate` (<= 0:
    all at t=0)."""
    n = spec.num_requests if num_requests is None else num_requests
    rng = seeded(seed, "shared-prefix")
    sys_n, q_n, out_n = (
        spec.tokens(spec.system_tokens),
        spec.tokens(spec.question_tokens),
        spec.tokens(spec.output_tokens),
    )
    systems = [random_text(rng, sys_n) for _ in range(spec.groups)]
    if spec.mode == "sample":
        prompts = [s + random_text(rng, q_n) for s in systems for _ in range(spec.prompts_per_group)]
        chosen = [rng.choice(prompts) for _ in range(n)] if n != len(prompts) else prompts
        rng.shuffle(chosen)
    elif spec.mode == "fresh":
        per_group = max(spec.prompts_per_group, -(-n // spec.groups))
        chosen = [s + random_text(rng, q_n) for s in systems for _ in range(per_group)]
        rng.shuffle(chosen)
        chosen = chosen[:n]
    else:
        raise ValueError(f"unknown shared-prefix mode {spec.mode!r}")
    times = poisson_arrivals(seeded(seed, "arrivals"), n, rate)
    return [completion_request(i, t, p, out_n) for i, (t, p) in enumerate(zip(times, chosen, strict=True))]
