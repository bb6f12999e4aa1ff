"""The workloads and run sizes of bench/serve_llm_routing.py (shared-prefix, long-prefix,
multi-lora), and the replicas' pod config for each; tests and bench/llm_router_decision.py reuse them."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from bench import workloads as wl
from ray_epp.simulator import SimRequest

# --- workloads -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Shape:
    """The run's size: workload lengths, rate and the replicas' KV cache."""

    requests: int = 240
    rate: float = 12.0
    groups: int = 16
    system_tokens: int = 2048
    question_tokens: int = 128
    output_tokens: int = 64
    num_gpu_blocks: int = 1024  # 16k tokens a replica: ~7 of the 16 shared prefixes fit
    lora_prompt_tokens: tuple[int, int] = (128, 1024)
    lora_output_tokens: tuple[int, int] = (16, 64)


TINY = Shape(requests=24, rate=12.0, groups=4, system_tokens=512, output_tokens=8, num_gpu_blocks=256,
             lora_output_tokens=(4, 8))  # fmt: skip


# RAG- or agent-shaped traffic as Ray Serve LLM deployments meet it: a long shared system prompt
# (instructions, tool definitions) per application, a long unique part per request (retrieved
# context, the conversation so far), at twice the rate. A hit still prefills ~1k tokens (~31 ms on
# the simulator's 8B-on-H100 timing), a miss ~5k (~150 ms), so the engines spend a good part of
# their time in prefill and where a request waits matters; the KV cache (32k tokens a replica)
# holds ~6 of the 16 prefixes, the same pressure as `shared-prefix`. Chosen before it was run.
LONG_PREFIX = {"requests": 480, "rate": 24.0, "system_tokens": 4096, "question_tokens": 1024,
               "num_gpu_blocks": 2048}  # fmt: skip
WORKLOADS = ("shared-prefix", "long-prefix", "multi-lora")


def shape_for(name: str, shape: Shape) -> Shape:
    """The run's shape for workload `name`: long-prefix has its own sizes, not the command line's."""
    return Shape(**{**asdict(shape), **LONG_PREFIX}) if name == "long-prefix" and shape != TINY else shape


def workload(name: str, shape: Shape, seed: int) -> list[SimRequest]:
    if name in ("shared-prefix", "long-prefix"):
        spec = wl.SharedPrefixSpec(
            groups=shape.groups, prompts_per_group=max(1, shape.requests // shape.groups),
            system_tokens=shape.system_tokens, question_tokens=shape.question_tokens,
            output_tokens=shape.output_tokens,
        )  # fmt: skip
        return wl.shared_prefix_workload(spec, shape.rate, seed, shape.requests)
    if name == "multi-lora":
        spec = wl.RandomPromptSpec(
            num_requests=shape.requests, prompt_tokens=shape.lora_prompt_tokens,
            output_tokens=shape.lora_output_tokens, adapters=wl.LORA_ADAPTERS,
        )  # fmt: skip
        return wl.random_prompt_workload(spec, shape.rate, seed)
    raise ValueError(f"unknown workload {name!r}")


def pod_config(name: str, shape: Shape) -> dict[str, Any]:
    pod: dict[str, Any] = {"num_gpu_blocks": shape.num_gpu_blocks}
    if name == "multi-lora":
        pod["lora_adapters"] = list(wl.LORA_ADAPTERS)
    return pod
