"""`core-metrics-extractor` (llm-d's pkg/epp/framework/plugins/datalayer/extractor/metrics): which
Prometheus series are an endpoint's queue, running requests, KV usage, LoRA state and cache
shape, per engine type (a pod label, `engineLabelKey`). Ray EPP's metrics actors map the scraped
text with the same parameters (`scheduler.engine_metrics.EngineRegistry.from_params`, built-in
vLLM / SGLang / TRT-LLM / Triton presets added unless an `engineConfigs` entry replaces one):
`ActorOptions.metrics_extractor`, which this plugin sets through `data_layer_actor_options`."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from scheduler.engine_metrics import EngineRegistry
from scheduler.interfaces import Parameters, Plugin
from scheduler.registry import register


class MetricsExtractorParameters(Parameters):
    engine_label_key: str = Field(default="", alias="engineLabelKey")
    default_engine: str = Field(default="", alias="defaultEngine")
    engine_configs: list[dict[str, Any]] = Field(default_factory=list, alias="engineConfigs")

    @model_validator(mode="after")
    def _valid(self) -> MetricsExtractorParameters:
        EngineRegistry.from_params(self.as_params())  # a ValueError names the bad entry
        return self

    def as_params(self) -> dict[str, Any]:
        """llm-d's parameter names, only those set (what EngineRegistry.from_params reads)."""
        return self.model_dump(by_alias=True, exclude_defaults=True)


@register
class CoreMetricsExtractor(Plugin):
    type_name = "core-metrics-extractor"
    Parameters = MetricsExtractorParameters

    @staticmethod
    def actor_options(p: MetricsExtractorParameters) -> dict[str, Any]:
        """The ActorOptions fields an extractor with these parameters sets (none at the defaults)."""
        params = p.as_params()
        return {"metrics_extractor": params} if params else {}
