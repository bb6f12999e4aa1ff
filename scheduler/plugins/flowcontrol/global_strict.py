"""`global-strict-fairness-policy`: no fairness between flows (llm-d-router
pkg/epp/framework/plugins/flowcontrol/fairness/globalstrict). The flow whose head request the
band's ordering policy ranks best goes next, so a band behaves as one queue: a flow sending five
times as much gets five times the dispatches."""

from __future__ import annotations

from typing import Any

from scheduler.flowcontrol.types import FlowQueue
from scheduler.interfaces import FairnessPolicy
from scheduler.registry import register


@register
class GlobalStrictFairnessPolicy(FairnessPolicy):
    type_name = "global-strict-fairness-policy"

    def pick(self, flows: list[FlowQueue], state: dict[str, Any]) -> FlowQueue:
        return min(flows, key=lambda q: q.head_key() or ())
