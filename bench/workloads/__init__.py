"""Benchmark workloads: seeded lists of `simulator.SimRequest` sorted by arrival time."""

from bench.workloads.agentic import AgenticSpec, agentic_workload
from bench.workloads.common import WorkloadUnavailable, completion_request
from bench.workloads.shared_prefix import (
    CACHE_PRESSURE,
    CACHE_PRESSURE_POD_BLOCKS,
    LLMD_SCALE,
    LLMD_SHARED_PREFIX,
    SGLANG_GSP,
    SharedPrefixSpec,
    prefix_to_cache_ratio,
    shared_prefix_workload,
)
from bench.workloads.sharegpt import ShareGPTSpec, load_conversations, parse_records, sharegpt_workload
from bench.workloads.synthetic import (
    CRITICAL,
    LORA_ADAPTERS,
    SHEDDABLE,
    RandomPromptSpec,
    mixed_priority_spec,
    multi_lora_spec,
    random_prompt_workload,
    uniform_spec,
)

__all__ = [
    "CACHE_PRESSURE",
    "CACHE_PRESSURE_POD_BLOCKS",
    "CRITICAL",
    "LLMD_SCALE",
    "LLMD_SHARED_PREFIX",
    "LORA_ADAPTERS",
    "SGLANG_GSP",
    "SHEDDABLE",
    "AgenticSpec",
    "RandomPromptSpec",
    "ShareGPTSpec",
    "SharedPrefixSpec",
    "WorkloadUnavailable",
    "agentic_workload",
    "completion_request",
    "load_conversations",
    "mixed_priority_spec",
    "multi_lora_spec",
    "parse_records",
    "prefix_to_cache_ratio",
    "random_prompt_workload",
    "shared_prefix_workload",
    "sharegpt_workload",
    "uniform_spec",
]
