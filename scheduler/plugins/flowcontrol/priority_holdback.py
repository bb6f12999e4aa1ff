"""`priority-holdback-policy`: lower bands are held back at lower saturation (llm-d-router
pkg/epp/framework/plugins/flowcontrol/usagelimits/priorityholdback). The ceilings run from
`maxCeiling` for the highest band to `minCeiling` for the lowest, linearly (`shape: linear`, the
only shape) by

* `domain: rank` (default): equal steps by rank, c_i = max - i * (max - min) / (N - 1);
* `domain: value`: in proportion to the priority values, c_i = min + (p_i - p_min) / (p_max -
  p_min) * (max - min) (all bands `maxCeiling` when every band has the same priority).

One band alone gets `maxCeiling` (nothing to hold back for). N is the bands the queue knows, as
llm-d's registry: every configured band and every band a request has made."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from scheduler.interfaces import Parameters, UsageLimitPolicy
from scheduler.registry import register


class PriorityHoldbackParameters(Parameters):
    shape: Literal["linear"] = "linear"
    domain: Literal["rank", "value"] = "rank"
    min_ceiling: float = Field(alias="minCeiling", ge=0.0, lt=1.0)  # required, as in llm-d
    max_ceiling: float = Field(default=1.0, alias="maxCeiling", gt=0.0, le=1.0)

    @model_validator(mode="after")
    def _ordered(self) -> PriorityHoldbackParameters:
        if self.min_ceiling >= self.max_ceiling:
            raise ValueError(
                f"minCeiling ({self.min_ceiling}) must be strictly less than maxCeiling ({self.max_ceiling})"
            )
        return self


@register
class PriorityHoldbackPolicy(UsageLimitPolicy):
    type_name = "priority-holdback-policy"
    Parameters = PriorityHoldbackParameters

    def ceilings(self, saturation: float, priorities: list[int]) -> list[float]:
        lo, hi, n = self.params.min_ceiling, self.params.max_ceiling, len(priorities)
        if n <= 1:
            return [hi] * n
        if self.params.domain == "rank":
            return [hi - i * (hi - lo) / (n - 1) for i in range(n)]
        p_max, p_min = priorities[0], priorities[-1]
        if p_max == p_min:
            return [hi] * n
        return [lo + (p - p_min) / (p_max - p_min) * (hi - lo) for p in priorities]
