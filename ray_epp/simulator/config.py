"""Pod configuration: one pydantic model per simulated model server, loadable from YAML.

Defaults describe a Llama-3.1-8B-class model served by vLLM on one H100-80GB; docs/SIMULATOR.md
explains where each number comes from.
"""

from __future__ import annotations

from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

DEFAULT_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
ROLE_LABEL = "llm-d.ai/role"

Role = Literal["prefill", "decode", "both"]
FailureType = Literal["429", "500", "503", "drop"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TimingConfig(_Strict):
    """Roofline-ish step cost: step = overhead + prefill tokens + decode seqs + KV read + LoRA loads."""

    step_overhead_s: float = Field(0.006, ge=0, description="weights read + launch per engine step")
    prefill_per_token_s: float = Field(3.0e-5, ge=0, description="compute-bound prefill cost per token")
    decode_per_seq_s: float = Field(8.0e-5, ge=0, description="per decoding sequence in the batch")
    kv_read_per_token_s: float = Field(4.0e-8, ge=0, description="attention KV read per context token")
    lora_load_s: float = Field(0.05, ge=0, description="added to the step that activates a new adapter")
    kv_transfer_latency_s: float = Field(0.002, ge=0, description="fixed P/D KV pull latency")
    kv_transfer_per_token_s: float = Field(2.6e-6, ge=0, description="P/D KV pull cost per token")
    cpu_load_per_token_s: float = Field(
        2.6e-6, ge=0, description="loading a CPU-offloaded token's KV back to the GPU (PCIe host to device)"
    )


class FailureConfig(_Strict):
    """Failure injection: a fraction of completion requests fail with one of `types`."""

    rate: float = Field(0.0, ge=0, le=1)
    types: list[FailureType] = Field(default_factory=lambda: ["500"])
    metrics_delay_s: float = Field(0.0, ge=0, description="real seconds /metrics waits before answering")
    metrics_garbage_rate: float = Field(0.0, ge=0, le=1, description="fraction of garbage /metrics pages")


class PodConfig(_Strict):
    name: str = "sim-0"
    model: str = DEFAULT_MODEL
    role: Role = "both"
    labels: dict[str, str] = Field(default_factory=dict)
    max_num_seqs: int = Field(256, ge=1)
    max_num_batched_tokens: int = Field(8192, ge=1)
    num_gpu_blocks: int = Field(27000, ge=1)
    block_size: int = Field(16, ge=1)
    max_model_len: int = Field(8192, ge=2)
    enable_prefix_caching: bool = True
    cpu_offload_blocks: int = Field(
        0, ge=0, description="a CPU-offload tier of this many blocks for what the GPU cache evicts (0: none)"
    )
    max_loras: int = Field(4, ge=0)
    lora_adapters: list[str] = Field(default_factory=list, description="adapters servable at start")
    timing: TimingConfig = Field(default_factory=TimingConfig)
    failures: FailureConfig = Field(default_factory=FailureConfig)
    startup_delay_s: float = Field(0.0, ge=0, description="model seconds /health answers 503")
    default_max_tokens: int = Field(16, ge=1)
    output_length: Literal["max_tokens", "random"] = Field(
        "max_tokens", description="random: seeded uniform 1..max_tokens unless ignore_eos"
    )
    seed: int | None = Field(None, description="overrides the cluster seed for this pod")
    kv_events: bool = Field(False, description="publish vLLM KV events (ZMQ PUB + replay) and key blocks as vLLM does")
    kv_events_port: int = Field(0, ge=0, le=65535, description="PUB port (0: a free one); replay port: a free one")
    prefix_caching_hash_algo: Literal["sha256_cbor", "sha256", "xxhash_cbor", "xxhash"] = "sha256_cbor"
    hash_seed: str | None = Field(
        None,
        description="the PYTHONHASHSEED vLLM would run with (seeds NONE_HASH); unset: as vLLM without it "
        "('vllm-none-hash' for sha256 algorithms, random for xxhash ones)",
    )
    tokenizer: str = Field(
        "", description="a tokenizer.json: count, cache and hash the prompt's real token ids (empty: 4 chars a token)"
    )

    def all_labels(self) -> dict[str, str]:
        """The pod's labels including the llm-d role label."""
        return {**self.labels, ROLE_LABEL: self.role}


def make_pod_configs(n: int, base: PodConfig | None = None, prefix: str = "sim", **overrides: Any) -> list[
    PodConfig
]:
    """n copies of `base` (or defaults) named prefix-0 .. prefix-(n-1), with field overrides."""
    data = (base or PodConfig()).model_dump()
    data.update(overrides)
    return [PodConfig.model_validate({**data, "name": f"{prefix}-{i}"}) for i in range(n)]


def load_pod_configs(source: str | dict[str, Any] | list[Any], default_count: int = 1) -> list[PodConfig]:
    """Pod configs from YAML text (or its parsed form).

    Accepted shapes: a list of pod dicts; or `{"defaults": {...}, "pods": [...]}` (each pod merged
    over the defaults; `pods` may be an int count); or a single pod dict used as the defaults for
    `default_count` pods. Pods without a name are called sim-<index>.
    """
    data = yaml.safe_load(source) if isinstance(source, str) else source
    defaults: dict[str, Any] = {}
    pods: list[Any]
    if data is None:
        pods = [{}] * default_count
    elif isinstance(data, list):
        pods = data
    elif isinstance(data, dict) and ("pods" in data or "defaults" in data):
        defaults = dict(data.get("defaults") or {})
        raw = data.get("pods", default_count)
        pods = [{}] * raw if isinstance(raw, int) else list(raw)
    elif isinstance(data, dict):
        defaults, pods = data, [{}] * default_count
    else:
        raise ValueError("pod config must be a list of pods or a mapping")
    out: list[PodConfig] = []
    for i, pod in enumerate(pods):
        if not isinstance(pod, dict):
            raise ValueError(f"pods[{i}] must be a mapping, got {type(pod).__name__}")
        merged = _deep_merge(defaults, pod)
        merged.setdefault("name", f"sim-{i}")
        out.append(PodConfig.model_validate(merged))
    names = [p.name for p in out]
    if len(set(names)) != len(names):
        raise ValueError(f"pod names must be unique: {names}")
    return out


def _deep_merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
