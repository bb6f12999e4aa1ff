"""Benchmark workloads: seeded lists of `simulator.SimRequest` sorted by arrival time."""

from bench.workloads.common import WorkloadUnavailable, completion_request
from bench.workloads.shared_prefix import (
    LLMD_SCALE,
    LLMD_SHARED_PREFIX,
    SGLANG_GSP,
    SharedPrefixSpec,
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
    "CRITICAL",
    "LLMD_SCALE",
    "LLMD_SHARED_PREFIX",
    "LORA_ADAPTERS",
    "SGLANG_GSP",
    "SHEDDABLE",
    "RandomPromptSpec",
    "ShareGPTSpec",
    "SharedPrefixSpec",
    "WorkloadUnavailable",
    "completion_request",
    "load_conversations",
    "mixed_priority_spec",
    "multi_lora_spec",
    "parse_records",
    "random_prompt_workload",
    "shared_prefix_workload",
    "sharegpt_workload",
    "uniform_spec",
]
