"""Gateway settings that are not scheduling config: limits, retries, objectives, P/D hand-off."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError


class GatewaySettings(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    # Inference objectives by name -> priority (GIE's InferenceObjective): requests name one in the
    # `x-gateway-inference-objective` header. Priority < 0 is sheddable.
    objectives: dict[str, int] = Field(default_factory=dict)
    max_body_bytes: int = Field(default=8 * 1024 * 1024, gt=0)
    # Answer 404 for a model no pod lists in /v1/models (nor runs, per its metrics). Turn off when
    # pods load LoRA adapters on demand that they do not list before the first request.
    reject_unknown_models: bool = True
    # A connection failure or a 503 before the first byte is retried on another endpoint.
    max_retries: int = Field(default=2, ge=0)
    upstream_timeout_s: float = Field(default=600.0, gt=0)
    connect_timeout_s: float = Field(default=5.0, gt=0)
    # Queue depth / KV thresholds of the saturation detector used for admission (GIE defaults).
    saturation_queue_depth: int = Field(default=5, ge=0)
    saturation_kv_cache: float = Field(default=0.8, ge=0, le=1)
    metrics_staleness_s: float = Field(default=2.0, gt=0)
    debug_header: str = "x-epp-debug"
    # P/D hand-off. "orchestrated": the gateway runs the prefill step on the prefill pod, then sends
    # the request with the returned kv_transfer_params to the decode pod. "sidecar": the gateway
    # only sets x-prefiller-host-port and forwards to the decode pod (llm-d's routing sidecar).
    pd_mode: Literal["orchestrated", "sidecar"] = "orchestrated"
    # A prefill step that fails (connection error, 5xx) is retried this many times on the same
    # prefill pod, then the request is served decode-only ("decode-only", as llm-d's sidecar does) or failed ("fail").
    pd_prefill_retries: int = Field(default=0, ge=0)
    pd_prefill_failure: Literal["decode-only", "fail"] = "decode-only"


def load_settings_file(path: str | Path) -> GatewaySettings:
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
        return GatewaySettings.model_validate(data)
    except OSError as err:
        raise ValueError(f"can not read settings file {str(path)!r}: {err.strerror}") from None
    except (yaml.YAMLError, ValidationError) as err:
        raise ValueError(f"invalid settings file {str(path)!r}: {err}") from None
