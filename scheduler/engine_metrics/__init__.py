"""Model-server metrics: per-engine metric specs (GIE's presets) and the Prometheus-text -> Metrics
parser the metrics actors run on every scrape."""

from scheduler.engine_metrics.parse import ParseResult, family_lines, parse_metrics
from scheduler.engine_metrics.spec import (
    DEFAULT_ENGINE,
    DEFAULT_ENGINE_LABEL_KEY,
    DEFAULT_REGISTRY,
    PRESETS,
    SGLANG,
    TRITON_TRTLLM,
    TRTLLM_SERVE,
    VLLM,
    EngineRegistry,
    EngineSpec,
    MetricSpec,
    engine_for_labels,
    parse_metric_spec,
)

__all__ = [
    "DEFAULT_ENGINE",
    "DEFAULT_ENGINE_LABEL_KEY",
    "DEFAULT_REGISTRY",
    "PRESETS",
    "SGLANG",
    "TRITON_TRTLLM",
    "TRTLLM_SERVE",
    "VLLM",
    "EngineRegistry",
    "EngineSpec",
    "MetricSpec",
    "ParseResult",
    "engine_for_labels",
    "family_lines",
    "parse_metric_spec",
    "parse_metrics",
]
