"""`round-robin-fairness-policy`: flows take turns (llm-d-router
pkg/epp/framework/plugins/flowcontrol/fairness/roundrobin). A cursor per band remembers the last
flow served; the next turn goes to the first flow after it, in sorted fairness-id order, that has
a request waiting (empty flows are skipped: work conserving). A flooding tenant gets no more
dispatches than any other backlogged one."""

from __future__ import annotations

from typing import Any

from scheduler.flowcontrol.types import FlowQueue
from scheduler.interfaces import FairnessPolicy
from scheduler.registry import register

CURSOR = "round-robin-cursor"


@register
class RoundRobinFairnessPolicy(FairnessPolicy):
    type_name = "round-robin-fairness-policy"

    def pick(self, flows: list[FlowQueue], state: dict[str, Any]) -> FlowQueue:
        ordered = sorted(flows, key=lambda q: q.fairness_id)
        last = state.get(CURSOR)
        chosen = ordered[0]
        if last is not None:
            chosen = next((q for q in ordered if q.fairness_id > last), ordered[0])
        state[CURSOR] = chosen.fairness_id
        return chosen
