"""The EndpointPickerConfig document as GIE and llm-d write it (pydantic, camelCase fields)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from scheduler.config.flow_control import FlowControlSpec

API_VERSIONS = ("inference.networking.x-k8s.io/v1alpha1", "llm-d.ai/v1alpha1", "llm-d.ai/v1")
KIND = "EndpointPickerConfig"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class PluginSpec(_Strict):
    name: str = ""
    type: str
    parameters: dict[str, Any] | None = None

    @field_validator("type")
    @classmethod
    def _type_not_empty(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("a plugin needs a type")
        return v


class ProfilePluginRef(_Strict):
    plugin_ref: str = Field(alias="pluginRef")
    weight: float | None = None

    @field_validator("weight")
    @classmethod
    def _weight_non_negative(cls, v: float | None) -> float | None:
        if v is not None and v < 0:
            raise ValueError("weight must be >= 0")
        return v


class SchedulingProfileSpec(_Strict):
    name: str
    plugins: list[ProfilePluginRef] = Field(default_factory=list)


class PluginRef(_Strict):
    """A section's `{pluginRef: name}` (llm-d's SaturationDetectorConfig, ParserConfig, ...)."""

    plugin_ref: str = Field(alias="pluginRef")


class DataLayerSource(_Strict):
    plugin_ref: str = Field(alias="pluginRef")
    extractors: list[PluginRef] = Field(default_factory=list)


class DataLayerSpec(_Strict):
    """llm-d's DataLayerConfig (apix/config/v1alpha1/endpointpickerconfig_types.go); what Ray EPP does
    with each field is decided in scheduler/config/sections.py."""

    inject_defaults: bool | None = Field(default=None, alias="injectDefaults")
    sources: list[DataLayerSource] = Field(default_factory=list)
    discovery: PluginRef | None = None
    peer_discovery: PluginRef | None = Field(default=None, alias="peerDiscovery")
    cross_replica_syncer_plugin_ref: str | None = Field(default=None, alias="crossReplicaSyncerPluginRef")
    cross_replica_sync_interval: str | None = Field(default=None, alias="crossReplicaSyncInterval")


class RequestHandlerSpec(_Strict):
    """llm-d's RequestHandlerConfig: the parsers that read request bodies."""

    parsers: list[PluginRef] = Field(default_factory=list)


class EndpointPickerConfig(_Strict):
    api_version: str = Field(default=API_VERSIONS[0], alias="apiVersion")
    kind: str = KIND
    feature_gates: list[str] = Field(default_factory=list, alias="featureGates")
    plugins: list[PluginSpec] = Field(default_factory=list)
    scheduling_profiles: list[SchedulingProfileSpec] = Field(default_factory=list, alias="schedulingProfiles")
    # The other sections llm-d has; scheduler/config/sections.py accepts what Ray EPP does and
    # refuses the rest by field. `saturationDetector` and `parser` are llm-d's deprecated top-level
    # forms of flowControl.saturationDetector and requestHandler.parsers.
    saturation_detector: PluginRef | None = Field(default=None, alias="saturationDetector")
    data_layer: DataLayerSpec | None = Field(default=None, alias="dataLayer")
    # llm-d's flow control (scheduler/config/flow_control.py); its queue runs with the `flowControl` gate.
    flow_control: FlowControlSpec | None = Field(default=None, alias="flowControl")
    request_handler: RequestHandlerSpec | None = Field(default=None, alias="requestHandler")
    parser: PluginRef | None = None

    @field_validator("api_version")
    @classmethod
    def _known_api_version(cls, v: str) -> str:
        if v not in API_VERSIONS:
            raise ValueError(f"apiVersion must be one of {list(API_VERSIONS)}")
        return v

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, v: str) -> str:
        if v != KIND:
            raise ValueError(f"kind must be {KIND!r}")
        return v

    @property
    def saturation_detector_ref(self) -> str | None:
        """The saturation detector the config names (flowControl.saturationDetector, else the
        deprecated top-level one, as llm-d's loader resolves them), or None for the default."""
        fc = self.flow_control
        if fc is not None and fc.saturation_detector is not None and fc.saturation_detector.plugin_ref:
            return fc.saturation_detector.plugin_ref
        return self.saturation_detector.plugin_ref if self.saturation_detector else None

    def plugin_spec(self, name: str) -> PluginSpec | None:
        for spec in self.plugins:
            if (spec.name or spec.type) == name:  # an unnamed plugin is named after its type
                return spec
        return None
