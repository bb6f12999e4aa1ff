"""A request's latency targets, from llm-d's headers: `x-slo-ttft-ms` (time to first token) and
`x-slo-tpot-ms` (time per output token), both positive milliseconds, and
`x-prediction-based-scheduling` (`true` / `false`: whether the predicted-latency plugins act on
this request; absent means yes). The gateway parses them at the edge (a malformed value is a 400
naming the header); the plugins read the same parse, kept in the request's derived data."""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from scheduler.data_keys import DataKey
from scheduler.errors import ErrorCode, SchedulingError
from scheduler.types import LLMRequest

TTFT_HEADER = "x-slo-ttft-ms"
TPOT_HEADER = "x-slo-tpot-ms"
PREDICTION_HEADER = "x-prediction-based-scheduling"


class SLOTargets(BaseModel):
    model_config = ConfigDict(frozen=True, populate_by_name=True)

    ttft_ms: float | None = Field(default=None, alias=TTFT_HEADER, gt=0.0)
    tpot_ms: float | None = Field(default=None, alias=TPOT_HEADER, gt=0.0)
    prediction: bool = Field(default=True, alias=PREDICTION_HEADER)

    @field_validator("ttft_ms", "tpot_ms")
    @classmethod
    def _finite(cls, value: float | None) -> float | None:
        if value is not None and not math.isfinite(value):
            raise ValueError("must be a finite number of milliseconds")
        return value

    @property
    def any(self) -> bool:
        return self.ttft_ms is not None or self.tpot_ms is not None

    def describe(self) -> str:
        parts = [f"{TTFT_HEADER}={self.ttft_ms:g}" if self.ttft_ms is not None else ""]
        parts.append(f"{TPOT_HEADER}={self.tpot_ms:g}" if self.tpot_ms is not None else "")
        return ", ".join(p for p in parts if p)


NO_TARGETS = SLOTargets()
SLO_TARGETS: DataKey[SLOTargets] = DataKey("slo/targets")  # the parse, once per request


def parse_slo_headers(headers: dict[str, str]) -> SLOTargets:
    """The targets in `headers` (names lower-case); SchedulingError(BadRequest) naming the header."""
    given = {k: v for k in (TTFT_HEADER, TPOT_HEADER, PREDICTION_HEADER) if (v := headers.get(k)) is not None}
    if not given:
        return NO_TARGETS
    try:
        return SLOTargets.model_validate({k: v.strip() for k, v in given.items()})
    except ValidationError as err:
        first = err.errors()[0]
        name = str(first["loc"][0]) if first.get("loc") else "SLO header"
        raise SchedulingError(
            ErrorCode.BAD_REQUEST, f"header {name}: {given.get(name)!r} is not valid ({first['msg']})"
        ) from None


def slo_targets(request: LLMRequest) -> SLOTargets:
    """The request's targets, parsed once per request per process."""
    targets = request.derived.get(SLO_TARGETS)
    if targets is None:
        targets = parse_slo_headers(request.headers)
        request.derived.put(SLO_TARGETS, targets)
    return targets


def relative_headroom(targets: SLOTargets, ttft_ms: float, tpot_ms: float | None) -> float | None:
    """The least of (target - predicted) / target over the targets the request carries (a TPOT
    target counts once the TPOT model predicts); >= 0 means predicted to meet them all. None when
    the request carries no target that a prediction covers."""
    worst: float | None = None
    if targets.ttft_ms is not None:
        worst = (targets.ttft_ms - ttft_ms) / targets.ttft_ms
    if targets.tpot_ms is not None and tpot_ms is not None:
        tpot = (targets.tpot_ms - tpot_ms) / targets.tpot_ms
        worst = tpot if worst is None else min(worst, tpot)
    return worst
