"""The `flowControl` section and the `flowControl` feature gate, as llm-d-router defines them
(apix/config/v1alpha1/endpointpickerconfig_types.go: FlowControlConfig, PriorityBandConfig;
pkg/epp/config/loader/flowcontrol.go and configloader.go: how they are resolved).

Sizes are Kubernetes resource quantities ("100", "1k", "500M", "1Gi"); durations are Go duration
strings ("30s", "1m"). The section is honoured only with the gate on: without it llm-d logs a
warning and ignores it (all but `saturationDetector`), and so does Ray EPP."""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer

from scheduler.duration import duration_seconds

FEATURE_GATE = "flowControl"  # llm-d-router pkg/epp/flowcontrol/config.go
DEFAULT_ORDERING_POLICY = "fcfs-ordering-policy"
DEFAULT_FAIRNESS_POLICY = "global-strict-fairness-policy"
DEFAULT_USAGE_LIMIT_POLICY = "static-usage-limit-policy"  # llm-d registry/config.go DefaultUsageLimitPolicyRef
DEFAULT_REQUEST_TTL_S = 60.0
DEFAULT_BAND_MAX_REQUESTS = 5000  # a per-band limit is always bounded (llm-d registry/config.go)
DEFAULT_BAND_MAX_BYTES = 1_000_000_000

_QUANTITY = re.compile(r"^\s*([+-]?(?:\d+\.?\d*|\.\d+))(?:[eE]([+-]?\d+))?(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?\s*$")
_SUFFIX = {
    None: 1.0, "n": 1e-9, "u": 1e-6, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
    "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50, "Ei": 2.0**60,
}  # fmt: skip
_TRUE = {"1", "t", "true"}
_FALSE = {"0", "f", "false"}


def parse_quantity(value: Any) -> int:
    """A Kubernetes resource quantity as an integer (rounded up, as Quantity.Value() does); >= 0."""
    if isinstance(value, bool):
        raise ValueError("expected a quantity such as 100, '1k' or '1Gi', not a boolean")
    if isinstance(value, int | float):
        number = float(value)
    elif isinstance(value, str):
        m = _QUANTITY.match(value)
        if m is None:
            raise ValueError(f"invalid quantity {value!r} (expected e.g. 100, '1k', '500M', '1Gi')")
        number = float(m.group(1)) * 10.0 ** int(m.group(2) or 0) * _SUFFIX[m.group(3)]
    else:
        raise ValueError(f"expected a quantity such as 100, '1k' or '1Gi', got {type(value).__name__}")
    if number < 0:
        raise ValueError(f"must be non-negative, got {value!r}")
    return math.ceil(number)


Quantity = Annotated[int, BeforeValidator(parse_quantity)]
# Seconds once loaded; written back as a Go duration, so a dumped config loads again.
Seconds = Annotated[
    float, BeforeValidator(duration_seconds), Field(ge=0.0), PlainSerializer(lambda v: f"{v:g}s", return_type=str)
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class PriorityBandSpec(_Strict):
    """One band. 0 or an omitted limit means the system default (5000 requests, 1 GB)."""

    priority: int = 0
    max_bytes: Quantity | None = Field(default=None, alias="maxBytes")
    max_requests: Quantity | None = Field(default=None, alias="maxRequests")
    fairness_policy_ref: str = Field(default="", alias="fairnessPolicyRef")
    ordering_policy_ref: str = Field(default="", alias="orderingPolicyRef")

    def band_max_requests(self) -> int:
        return self.max_requests or DEFAULT_BAND_MAX_REQUESTS

    def band_max_bytes(self) -> int:
        return self.max_bytes or DEFAULT_BAND_MAX_BYTES


class SaturationDetectorRef(_Strict):
    plugin_ref: str = Field(default="", alias="pluginRef")


class FlowControlSpec(_Strict):
    """Global limits (0 / omitted: none), the queue-wait TTLs, band templates and explicit bands."""

    max_bytes: Quantity | None = Field(default=None, alias="maxBytes")
    max_requests: Quantity | None = Field(default=None, alias="maxRequests")
    default_request_ttl: Seconds | None = Field(default=None, alias="defaultRequestTTL")
    no_endpoint_request_ttl: Seconds | None = Field(default=None, alias="noEndpointRequestTTL")
    default_priority_band: PriorityBandSpec | None = Field(default=None, alias="defaultPriorityBand")
    default_negative_priority_band: PriorityBandSpec | None = Field(default=None, alias="defaultNegativePriorityBand")
    priority_bands: list[PriorityBandSpec] = Field(default_factory=list, alias="priorityBands")
    usage_limit_policy_plugin_ref: str = Field(default="", alias="usageLimitPolicyPluginRef")
    saturation_detector: SaturationDetectorRef | None = Field(default=None, alias="saturationDetector")
    enable_eviction: bool = Field(default=False, alias="enableEviction")

    def request_ttl(self) -> float:
        """The queue-wait budget while the pool has endpoints (0: no limit)."""
        return DEFAULT_REQUEST_TTL_S if self.default_request_ttl is None else self.default_request_ttl

    def no_endpoint_ttl(self) -> float:
        """The budget while the pool has none; follows `defaultRequestTTL` when omitted."""
        return self.request_ttl() if self.no_endpoint_request_ttl is None else self.no_endpoint_request_ttl

    def settings_configured(self) -> bool:
        """Settings beyond `saturationDetector` (which the shed-only path honours too)."""
        return bool(
            self.max_bytes is not None or self.max_requests is not None or self.default_request_ttl is not None
            or self.no_endpoint_request_ttl is not None or self.default_priority_band is not None
            or self.default_negative_priority_band is not None or self.priority_bands
            or self.usage_limit_policy_plugin_ref or self.enable_eviction
        )  # fmt: skip

    def band_spec(self, priority: int) -> PriorityBandSpec:
        """The explicit band for `priority`, else the (negative) default band template."""
        for band in self.priority_bands:
            if band.priority == priority:
                return band
        template = self.default_priority_band
        if priority < 0 and self.default_negative_priority_band is not None:
            template = self.default_negative_priority_band
        if template is None:
            return PriorityBandSpec(priority=priority)
        return template.model_copy(update={"priority": priority})


def parse_feature_gates(gates: list[str]) -> dict[str, bool]:
    """llm-d's gate list: "name", "name=true" or "name=false" (Go's ParseBool spellings)."""
    out: dict[str, bool] = {}
    for gate in gates:
        name, sep, raw = gate.partition("=")
        name = name.strip()
        if not name:
            raise ValueError(f"feature gate {gate!r} has no name")
        value = True
        if sep:
            word = raw.strip().lower()
            if word not in _TRUE | _FALSE:
                raise ValueError(f"feature gate {gate!r}: {raw.strip()!r} is not true or false")
            value = word in _TRUE
        out[name] = value
    return out
