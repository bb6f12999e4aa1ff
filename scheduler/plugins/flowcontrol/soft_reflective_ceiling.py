"""`soft-reflective-ceiling-policy`: lower bands are throttled in proportion as saturation rises
(llm-d-router pkg/epp/framework/plugins/flowcontrol/usagelimits/softreflectiveceiling). No
parameters.

The highest band's ceiling is 1. Band i of N (0 highest) has the reflective ceiling
1 - i * saturation / (N - 1): below it the band is open (ceiling 1); at saturation 1 or more it is
shut (0); in between it opens on one dispatch cycle in `period` = round(saturation / (1 -
saturation)), so its dispatch rate falls smoothly as the pool fills. One tick counter, advanced
only on cycles where some band is in that regime, serves every band, so on any cycle the throttled
bands are all open or all shut (the queue stops at the first shut band). The tick is this
instance's: each gateway replica (or simulated router) throttles its own dispatches."""

from __future__ import annotations

import math

from scheduler.interfaces import PluginHandle, UsageLimitPolicy
from scheduler.registry import register


@register
class SoftReflectiveCeilingPolicy(UsageLimitPolicy):
    type_name = "soft-reflective-ceiling-policy"

    def setup(self, handle: PluginHandle) -> None:
        self.tick = 0

    def ceilings(self, saturation: float, priorities: list[int]) -> list[float]:
        n = len(priorities)
        if n <= 1:
            return [1.0] * n
        open_now = False
        if 1.0 - saturation <= saturation < 1.0:  # the lowest band is at its reflective ceiling
            period = max(1, math.floor(saturation / (1.0 - saturation + 1e-9) + 0.5))  # Go's Round
            self.tick += 1
            open_now = self.tick % period == 0
        out = [1.0]
        for i in range(1, n):
            if saturation < 1.0 - i * saturation / (n - 1):
                out.append(1.0)
            elif saturation >= 1.0:
                out.append(0.0)
            else:
                out.append(1.0 if open_now else 0.0)
        return out
