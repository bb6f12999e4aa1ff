"""llm-d's role filters on the pod label `llm-d.ai/role`: `decode-filter`, `prefill-filter` and
`encode-filter`, the profile filters of P/D and E/P/D disaggregation.

| role label value         | decode | prefill | encode |
|--------------------------|--------|---------|--------|
| decode                   | yes    |         |        |
| prefill                  |        | yes     |        |
| encode                   |        |         | yes    |
| prefill-decode, both     | yes    | yes     |        |
| encode-prefill           |        | yes     | yes    |
| encode-prefill-decode    | yes    | yes     | yes    |
| (no label)               | yes    |         |        |

A pod without the label is an ordinary aggregated server and counts as decode-capable; any other
value (including an empty one) passes no filter. `both` is llm-d's deprecated `prefill-decode`."""

from __future__ import annotations

from typing import ClassVar

from scheduler.cycle_state import CycleState
from scheduler.interfaces import Filter
from scheduler.registry import register
from scheduler.types import Endpoint, LLMRequest

ROLE_LABEL = "llm-d.ai/role"

ROLE_DECODE = "decode"
ROLE_PREFILL = "prefill"
ROLE_ENCODE = "encode"
ROLE_PREFILL_DECODE = "prefill-decode"
ROLE_ENCODE_PREFILL = "encode-prefill"
ROLE_ENCODE_PREFILL_DECODE = "encode-prefill-decode"
ROLE_BOTH = "both"  # deprecated in llm-d: use prefill-decode


class RoleFilter(Filter):
    """Keeps endpoints whose role label is one of `roles`, and unlabelled ones when `allows_no_label`."""

    roles: ClassVar[frozenset[str]] = frozenset()
    allows_no_label: ClassVar[bool] = False

    def filter(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        roles, unlabelled = self.roles, self.allows_no_label
        kept = []
        for ep in endpoints:
            role = ep.labels.get(ROLE_LABEL)
            if role in roles if role is not None else unlabelled:
                kept.append(ep)
        return kept


@register
class DecodeFilter(RoleFilter):
    type_name = "decode-filter"
    roles = frozenset({ROLE_DECODE, ROLE_PREFILL_DECODE, ROLE_BOTH, ROLE_ENCODE_PREFILL_DECODE})
    allows_no_label = True


@register
class PrefillFilter(RoleFilter):
    type_name = "prefill-filter"
    roles = frozenset({ROLE_PREFILL, ROLE_ENCODE_PREFILL, ROLE_PREFILL_DECODE, ROLE_BOTH, ROLE_ENCODE_PREFILL_DECODE})


@register
class EncodeFilter(RoleFilter):
    type_name = "encode-filter"
    roles = frozenset({ROLE_ENCODE, ROLE_ENCODE_PREFILL, ROLE_ENCODE_PREFILL_DECODE})
