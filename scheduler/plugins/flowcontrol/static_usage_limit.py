"""`static-usage-limit-policy`: one ceiling for every band (llm-d-router
pkg/epp/framework/plugins/flowcontrol/usagelimits). With the default `threshold` 1.0 a band
dispatches until the pool is saturated, which is what the queue does without a policy; a lower
value holds every band back earlier, leaving headroom. llm-d adds it when flow control is on and
the config names no usage-limit policy, and so does the loader here.

llm-d's README bounds `threshold` to (0, 1] but its factory does not check; here a value outside
is a load-time error."""

from __future__ import annotations

from pydantic import Field

from scheduler.interfaces import Parameters, UsageLimitPolicy
from scheduler.registry import register


class StaticUsageLimitParameters(Parameters):
    threshold: float = Field(default=1.0, gt=0.0, le=1.0)


@register
class StaticUsageLimitPolicy(UsageLimitPolicy):
    type_name = "static-usage-limit-policy"
    Parameters = StaticUsageLimitParameters

    def ceilings(self, saturation: float, priorities: list[int]) -> list[float]:
        return [self.params.threshold] * len(priorities)
