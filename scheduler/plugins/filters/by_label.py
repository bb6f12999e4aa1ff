"""`by-label` (llm-d, deprecated there in favour of `label-selector-filter`): keep endpoints whose
label `label` has one of `validValues`; endpoints without the label are kept only when
`allowsNoLabel` is true."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from scheduler.cycle_state import CycleState
from scheduler.interfaces import Filter, Parameters, PluginHandle
from scheduler.plugins.filters.label_selector import check_label_key
from scheduler.registry import register
from scheduler.types import Endpoint, LLMRequest


class ByLabelParameters(Parameters):
    label: str
    valid_values: list[str] = Field(default_factory=list, alias="validValues")
    allows_no_label: bool = Field(default=False, alias="allowsNoLabel")

    @field_validator("label")
    @classmethod
    def _label(cls, v: str) -> str:
        return check_label_key(v)

    @model_validator(mode="after")
    def _something_passes(self) -> ByLabelParameters:
        if not self.valid_values and not self.allows_no_label:
            raise ValueError("either 'validValues' must be non-empty or 'allowsNoLabel' must be true")
        return self


@register
class ByLabelFilter(Filter):
    type_name = "by-label"
    Parameters = ByLabelParameters

    def setup(self, handle: PluginHandle) -> None:
        self._valid = frozenset(self.params.valid_values)

    def filter(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        label, valid, allow_missing = self.params.label, self._valid, self.params.allows_no_label
        # As llm-d: a missing label reads as "" (so validValues [""] keeps it too).
        return [
            ep for ep in endpoints if ep.labels.get(label, "") in valid or (allow_missing and label not in ep.labels)
        ]
