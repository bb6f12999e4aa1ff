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


class EndpointPickerConfig(_Strict):
    api_version: str = Field(default=API_VERSIONS[0], alias="apiVersion")
    kind: str = KIND
    feature_gates: list[str] = Field(default_factory=list, alias="featureGates")
    plugins: list[PluginSpec] = Field(default_factory=list)
    scheduling_profiles: list[SchedulingProfileSpec] = Field(default_factory=list, alias="schedulingProfiles")
    # GIE sections the scheduler does not use itself; kept so a GIE config loads as written.
    saturation_detector: dict[str, Any] | None = Field(default=None, alias="saturationDetector")
    data_layer: dict[str, Any] | None = Field(default=None, alias="dataLayer")
    # llm-d's flow control (scheduler/config/flow_control.py); used with the `flowControl` gate on.
    flow_control: FlowControlSpec | None = Field(default=None, alias="flowControl")
    parser: dict[str, Any] | None = None

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

    def plugin_spec(self, name: str) -> PluginSpec | None:
        for spec in self.plugins:
            if spec.name == name:
                return spec
        return None
