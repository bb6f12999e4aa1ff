"""Which Prometheus metrics carry a model server's state, per engine (GIE's core-metrics-extractor).

An `EngineSpec` names, for one engine type, the metric (and label selector) that holds the queue
length, the running requests, the KV-cache usage, the LoRA adapters and the KV-cache geometry. The
built-in presets are GIE's (vLLM, SGLang, trtllm-serve, Triton TRT-LLM); a pod picks one with the
label `inference.networking.k8s.io/engine-type`, unknown or missing values use the default engine.
`EngineRegistry.from_params` reads GIE's `core-metrics-extractor` parameters
(`engineLabelKey`, `defaultEngine`, `engineConfigs[]`)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

DEFAULT_ENGINE_LABEL_KEY = "inference.networking.k8s.io/engine-type"
DEFAULT_ENGINE = "vllm"

# Label names of vLLM's info gauges (GIE's extractor constants).
LORA_RUNNING_LABEL = "running_lora_adapters"
LORA_WAITING_LABEL = "waiting_lora_adapters"
LORA_MAX_LABEL = "max_lora"
BLOCK_SIZE_LABEL = "block_size"
NUM_BLOCKS_LABEL = "num_gpu_blocks"


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One metric: its name and the label values a sample must have (GIE's Spec)."""

    name: str
    labels: tuple[tuple[str, str], ...] = ()

    def __str__(self) -> str:
        if not self.labels:
            return self.name
        return self.name + "{" + ",".join(f"{k}={v}" for k, v in self.labels) + "}"


_SELECTOR_RE = re.compile(r"\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?:\{(.*)\})?\s*$", re.S)
_MATCHER_RE = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!=|!~|=)\s*(?:"((?:[^"\\]|\\.)*)"|([^",}\s]+))\s*(?:,|$)')


def parse_metric_spec(text: str | None) -> MetricSpec | None:
    """A spec from PromQL instant-selector syntax, `name{label=value,...}`; quotes around values
    are optional, as in GIE. Empty text means "disabled" (None). Only `=` matchers select, other
    matchers and `__`-labels are ignored (GIE does the same)."""
    if text is None or not text.strip():
        return None
    m = _SELECTOR_RE.match(text)
    if m is None:
        raise ValueError(f"not a valid metric specification: {text!r} (want name or name{{label=value,...}})")
    name, body = m.group(1), m.group(2)
    labels: list[tuple[str, str]] = []
    if body is not None and body.strip():
        pos = 0
        while pos < len(body):
            mm = _MATCHER_RE.match(body, pos)
            if mm is None or mm.end() == pos:
                raise ValueError(f"not a valid metric specification: {text!r} (bad label matcher at {body[pos:]!r})")
            label, op, quoted, bare = mm.groups()
            value = quoted if quoted is not None else bare
            if op == "=" and not label.startswith("__"):
                labels.append((label, value))
            pos = mm.end()
    return MetricSpec(name, tuple(sorted(labels)))


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """Where one engine exposes the Model Server Protocol metrics (GIE's Mapping).

    `queued`, `running` and `kv_usage` are required: a page without them fails the scrape. Each is a
    tuple tried in order, so a preset can fall back to an older metric name. `lora`, `cache_info`,
    `cache_block_size` and `cache_num_blocks` are optional: when missing, the scrape succeeds with a
    warning and those fields keep their previous values."""

    name: str
    queued: tuple[MetricSpec, ...] = ()
    running: tuple[MetricSpec, ...] = ()
    kv_usage: tuple[MetricSpec, ...] = ()
    lora: MetricSpec | None = None
    cache_info: MetricSpec | None = None
    cache_block_size_label: str = BLOCK_SIZE_LABEL
    cache_num_blocks_label: str = NUM_BLOCKS_LABEL
    cache_block_size: MetricSpec | None = None
    cache_num_blocks: MetricSpec | None = None
    families: frozenset[str] = field(default=frozenset(), compare=False)

    def __post_init__(self) -> None:
        names = {s.name for group in (self.queued, self.running, self.kv_usage) for s in group}
        names.update(s.name for s in (self.lora, self.cache_info, self.cache_block_size, self.cache_num_blocks) if s)
        object.__setattr__(self, "families", frozenset(names))

    @classmethod
    def from_strings(
        cls,
        name: str,
        queued: str = "",
        running: str = "",
        kv_usage: str = "",
        lora: str = "",
        cache_info: str = "",
        cache_block_size_label: str = "",
        cache_num_blocks_label: str = "",
        cache_block_size: str = "",
        cache_num_blocks: str = "",
    ) -> EngineSpec:
        """Build from GIE's spec strings; `kv_usage` etc. may list fallbacks separated by `|`."""

        def group(text: str) -> tuple[MetricSpec, ...]:
            return tuple(s for part in (text or "").split("|") if (s := parse_metric_spec(part)) is not None)

        return cls(
            name=name,
            queued=group(queued),
            running=group(running),
            kv_usage=group(kv_usage),
            lora=parse_metric_spec(lora),
            cache_info=parse_metric_spec(cache_info),
            cache_block_size_label=cache_block_size_label or BLOCK_SIZE_LABEL,
            cache_num_blocks_label=cache_num_blocks_label or NUM_BLOCKS_LABEL,
            cache_block_size=parse_metric_spec(cache_block_size),
            cache_num_blocks=parse_metric_spec(cache_num_blocks),
        )


# GIE's defaultEngineConfigs (pkg/epp/framework/plugins/datalayer/extractor/metrics/factories.go), plus
# one addition: vLLM's KV usage falls back to `vllm:gpu_cache_usage_perc`, the name before vLLM 0.10.
VLLM = EngineSpec.from_strings(
    "vllm",
    queued="vllm:num_requests_waiting",
    running="vllm:num_requests_running",
    kv_usage="vllm:kv_cache_usage_perc|vllm:gpu_cache_usage_perc",
    lora="vllm:lora_requests_info",
    cache_info="vllm:cache_config_info",
)
SGLANG = EngineSpec.from_strings(
    "sglang",
    queued="sglang:num_queue_reqs",
    running="sglang:num_running_reqs",
    kv_usage="sglang:token_usage",
    cache_info="sglang:cache_config_info",
    cache_block_size_label="page_size",
    cache_num_blocks_label="num_pages",
)
TRTLLM_SERVE = EngineSpec.from_strings(
    "trtllm-serve",
    queued="trtllm_num_requests_waiting",
    running="trtllm_num_requests_running",
    kv_usage="trtllm_kv_cache_utilization",
    cache_block_size="trtllm_kv_cache_tokens_per_block",
    cache_num_blocks="trtllm_kv_cache_max_blocks",
)
TRITON_TRTLLM = EngineSpec.from_strings(
    "triton-tensorrt-llm",
    queued="nv_trt_llm_request_metrics{request_type=waiting}",
    running="nv_trt_llm_request_metrics{request_type=scheduled}",
    kv_usage="nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=fraction}",
    cache_block_size="nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=tokens_per}",
    cache_num_blocks="nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=max}",
)
PRESETS: dict[str, EngineSpec] = {s.name: s for s in (VLLM, SGLANG, TRTLLM_SERVE, TRITON_TRTLLM)}

# GIE's engineConfigs[] field names -> EngineSpec.from_strings arguments.
_PARAM_FIELDS = {
    "queuedRequestsSpec": "queued",
    "runningRequestsSpec": "running",
    "kvUsageSpec": "kv_usage",
    "loraSpec": "lora",
    "cacheInfoSpec": "cache_info",
    "cacheBlockSizeLabelName": "cache_block_size_label",
    "cacheNumBlocksLabelName": "cache_num_blocks_label",
    "cacheBlockSizeSpec": "cache_block_size",
    "cacheNumBlocksSpec": "cache_num_blocks",
}


@dataclass(frozen=True, slots=True)
class EngineRegistry:
    """The engine specs by name and how a pod's labels choose one (GIE's MappingRegistry)."""

    engines: Mapping[str, EngineSpec]
    default_engine: str = DEFAULT_ENGINE
    label_key: str = DEFAULT_ENGINE_LABEL_KEY

    def __post_init__(self) -> None:
        if self.default_engine not in self.engines:
            raise ValueError(f"defaultEngine {self.default_engine!r} not found in engineConfigs {sorted(self.engines)}")

    def for_labels(self, labels: Mapping[str, str] | None) -> EngineSpec:
        """The spec for a pod: its engine-type label, or the default engine when unset or unknown."""
        engine = (labels or {}).get(self.label_key) or self.default_engine
        return self.engines.get(engine) or self.engines[self.default_engine]

    @classmethod
    def from_params(cls, params: Mapping[str, Any] | None = None) -> EngineRegistry:
        """From GIE's core-metrics-extractor parameters; built-in presets are added unless an
        engineConfigs entry of the same name replaces them. Raises ValueError naming the entry."""
        params = dict(params or {})
        unknown = set(params) - {"engineLabelKey", "defaultEngine", "engineConfigs"}
        if unknown:
            raise ValueError(f"unknown metrics-extractor parameters: {sorted(unknown)}")
        engines: dict[str, EngineSpec] = {}
        for i, cfg in enumerate(params.get("engineConfigs") or []):
            if not isinstance(cfg, Mapping):
                raise ValueError(f"engineConfigs[{i}]: must be a mapping")
            name = cfg.get("name")
            if not name or not isinstance(name, str):
                raise ValueError(f"engineConfigs[{i}]: engine config name cannot be empty")
            if name == "default":
                raise ValueError(f"engineConfigs[{i}]: engine config name cannot be 'default' (reserved)")
            if name in engines:
                raise ValueError(f"engineConfigs[{i}]: engine {name!r} is defined twice")
            bad = set(cfg) - {"name", *_PARAM_FIELDS}
            if bad:
                raise ValueError(f"engineConfigs[{i}] {name!r}: unknown fields {sorted(bad)}")
            kwargs = {_PARAM_FIELDS[k]: str(v or "") for k, v in cfg.items() if k in _PARAM_FIELDS}
            try:
                engines[name] = EngineSpec.from_strings(name, **kwargs)
            except ValueError as err:
                raise ValueError(f"engineConfigs[{i}] {name!r}: {err}") from None
        for name, preset in PRESETS.items():
            engines.setdefault(name, preset)
        return cls(
            engines=engines,
            default_engine=params.get("defaultEngine") or DEFAULT_ENGINE,
            label_key=params.get("engineLabelKey") or DEFAULT_ENGINE_LABEL_KEY,
        )


DEFAULT_REGISTRY = EngineRegistry(PRESETS)


def engine_for_labels(labels: Mapping[str, str] | None) -> EngineSpec:
    """The built-in preset a pod's labels choose (vLLM unless labelled otherwise)."""
    return DEFAULT_REGISTRY.for_labels(labels)
