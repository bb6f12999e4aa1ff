"""The benchmark scenarios: pods, workload, rate ladder, policies and which targets apply.

**Rates** are fractions of the pool's *capacity*, measured by a short calibration before each
sweep (`bench.runner.calibrate`): the most requests per second round-robin gets through the pool
with the scenario's workload, found with a burst and a few Poisson probes. It is what a
cache-oblivious router sustains, the reference for "near saturation" (`NEAR_SATURATION` = 0.9x)
and "1.5x capacity".

**Run length.** Each rung of the ladder lasts `duration_s` seconds of Poisson arrivals
(rate x duration requests, at least `min_requests`), a few times the requests' end-to-end latency
near saturation, so that queues have time to form: a fixed request count would end a fast rung
before the pool fills. The same seed gives the same requests per rung for every policy."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from bench import workloads as wl
from ray_epp.simulator import PodConfig, SimRequest, make_pod_configs

CALIBRATION_REQUESTS_PER_POD = 512  # the calibration burst: vLLM's max_num_seqs (256) x 2 per pod
NEAR_SATURATION = 0.9

ALL_PEERS = ("round-robin", "random", "least-queue", "power-of-two", "ray-prefix-affinity", "sglang-cache-aware")
OURS = ("epp-default", "epp-gie-default", "epp-legacy-filter-tree")
EXPERIMENTS = ("epp-strict-admission", "epp-flow-control")  # bench/configs: not shipped, measured beside ours

WorkloadFn = Callable[[float, int, int], list[SimRequest]]  # (rate, seed, requests) -> requests


@dataclass(slots=True)
class Scenario:
    name: str
    title: str
    description: str
    pods: Callable[[], list[PodConfig]]
    workload: WorkloadFn
    fractions: tuple[float, ...]
    policies: tuple[str, ...]
    duration_s: float = 40.0
    min_requests: int = 500
    target: str = ""  # which check in bench.targets applies ("" = none)
    check_available: Callable[[], object] | None = None  # raises WorkloadUnavailable

    def requests_at(self, rate: float) -> int:
        return max(self.min_requests, math.ceil(rate * self.duration_s))

    def run_workload(self, rate: float, seed: int) -> list[SimRequest]:
        return self.workload(rate, seed, self.requests_at(rate))

    def calibration_burst(self, pods: int, seed: int) -> list[SimRequest]:
        burst = self.workload(0.0, seed, CALIBRATION_REQUESTS_PER_POD * pods)
        for r in burst:  # all at once (multi-turn sessions too)
            r.arrival_time = 0.0
        return burst


def _shared_prefix(
    name: str,
    title: str,
    spec: wl.SharedPrefixSpec,
    pods: int,
    source: str,
    duration_s: float,
    pod_blocks: int | None = None,
) -> Scenario:
    reuse = (
        "more questions per group when a rung needs more requests"
        if spec.mode == "fresh"
        else "requests drawn at random from the groups x prompts set"
    )
    return Scenario(
        name=name,
        title=title,
        description=(
            f"{spec.groups} groups x {spec.prompts_per_group} prompts, system prompt "
            f"{spec.tokens(spec.system_tokens)} tokens, question {spec.tokens(spec.question_tokens)}, "
            f"output {spec.tokens(spec.output_tokens)} ({source}; {reuse}); {pods} pods"
            + (f" of {pod_blocks:,} KV blocks." if pod_blocks else ".")
        ),
        pods=lambda: make_pod_configs(pods, **({"num_gpu_blocks": pod_blocks} if pod_blocks else {})),
        workload=lambda rate, seed, n: wl.shared_prefix_workload(spec, rate, seed, n),
        fractions=(0.25, 0.5, 0.75, NEAR_SATURATION, 1.1),
        policies=(*OURS, *ALL_PEERS),
        duration_s=duration_s,
        target="shared-prefix",
    )


def _random(spec_fn: Callable[[int], wl.RandomPromptSpec]) -> WorkloadFn:
    return lambda rate, seed, n: wl.random_prompt_workload(spec_fn(n), rate, seed)


def build_scenarios() -> dict[str, Scenario]:
    scenarios = [
        _shared_prefix(
            "shared-prefix", "Shared prefix (SGLang generated-shared-prefix)", wl.SGLANG_GSP, 8, "SGLang's defaults", 40
        ),
        _shared_prefix(
            "shared-prefix-llmd",
            "Shared prefix (llm-d's benchmark shape, lengths x0.5)",
            wl.LLMD_SHARED_PREFIX,
            8,
            f"llm-d's 6,000 / 1,200 / 1,000 scaled by {wl.LLMD_SCALE}",
            60,
        ),
        _shared_prefix(
            "cache-pressure",
            "Cache pressure (prefixes 3x the pool's KV cache)",
            wl.CACHE_PRESSURE,
            8,
            f"system prompts {wl.prefix_to_cache_ratio(wl.CACHE_PRESSURE, 8, wl.CACHE_PRESSURE_POD_BLOCKS):.0f}x "
            "the pool's KV cache, so pods evict",
            40,
            pod_blocks=wl.CACHE_PRESSURE_POD_BLOCKS,
        ),
        Scenario(
            name="multi-lora",
            title="Multi-LoRA",
            description=(
                "Every request to one of 15 adapters, zipf(1.0) popularity; unique prompts of 128-1,024 tokens, "
                "16-256 output tokens; 8 pods with max_loras 4, every adapter servable on every pod."
            ),
            pods=lambda: make_pod_configs(8, max_loras=4, lora_adapters=list(wl.LORA_ADAPTERS)),
            workload=_random(wl.multi_lora_spec),
            fractions=(0.25, 0.5, 0.75, NEAR_SATURATION),
            policies=("epp-lora", *OURS, *ALL_PEERS),
            target="multi-lora",
        ),
        Scenario(
            name="overload",
            title="Mixed priority under overload",
            description=(
                "Half the requests critical (priority 1), half sheddable (priority -1); unique prompts of "
                "128-1,024 tokens, 16-256 output tokens; 8 pods."
            ),
            pods=lambda: make_pod_configs(8),
            workload=_random(wl.mixed_priority_spec),
            fractions=(0.5, 1.0, 1.5),
            policies=(*OURS, "epp-priority", *EXPERIMENTS, *ALL_PEERS),  # admission matters here only
            target="overload",
        ),
        Scenario(
            name="uniform",
            title="Uniform random prompts (the control)",
            description="Unique prompts of 128-1,024 tokens, 16-256 output tokens; 8 pods.",
            pods=lambda: make_pod_configs(8),
            workload=_random(wl.uniform_spec),
            fractions=(0.25, 0.5, 0.75, NEAR_SATURATION),
            policies=(*OURS, *ALL_PEERS),
            target="uniform",
        ),
        Scenario(
            name="agentic",
            title="Agentic sessions (tool-call loops)",
            description=(
                "Sessions of 4-16 tool calls and a final answer: 4 agent types' 3,000-token system prompts, a "
                "300-token task, each turn the whole conversation so far, 30-150 output tokens a tool call "
                "(200-500 the answer), tool results of 100-1,000 tokens (1,500-3,000 in a tenth of the "
                "sessions), 1 s mean tool time between turns, up to 8,192 tokens; 8 pods."
            ),
            pods=lambda: make_pod_configs(8),
            workload=lambda rate, seed, n: wl.agentic_workload(rate, seed, wl.AgenticSpec(num_requests=n)),
            fractions=(0.5, NEAR_SATURATION, 1.1),
            policies=(
                "epp-default",
                "epp-default-unsticky",
                "epp-llmd-sticky-until-saturated",
                "sglang-cache-aware",
                "round-robin",
            ),
            duration_s=60,
        ),
        Scenario(
            name="sharegpt",
            title="ShareGPT conversations (multi-turn)",
            description=(
                "ShareGPT V3 conversations, up to 8 turns each, each turn's prompt the whole conversation so far "
                "and its output the dataset's answer (max 1,024 tokens); 8 pods."
            ),
            pods=lambda: make_pod_configs(8),
            workload=lambda rate, seed, n: wl.sharegpt_workload(rate, seed, wl.ShareGPTSpec(num_requests=n)),
            fractions=(0.25, 0.5, 0.75, NEAR_SATURATION),
            policies=(*OURS, *ALL_PEERS),
            duration_s=60,
            check_available=wl.load_conversations,
        ),
    ]
    return {s.name: s for s in scenarios}


SCENARIOS = build_scenarios()
