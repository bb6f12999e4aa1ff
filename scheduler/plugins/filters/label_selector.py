"""`label-selector-filter` (llm-d; older name `by-label-selector`): keep endpoints whose labels match
a Kubernetes label selector.

Parameters are a metav1.LabelSelector: `matchLabels` (every pair must match) and
`matchExpressions` ({key, operator, values} with In, NotIn, Exists, DoesNotExist). All
requirements are ANDed; an empty selector matches every endpoint. As in Kubernetes, `NotIn` and
`DoesNotExist` match an endpoint that lacks the label. Keys and values are checked as Kubernetes
checks them, so a selector Kubernetes would reject fails at load time."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from scheduler.cycle_state import CycleState
from scheduler.interfaces import Filter, Parameters
from scheduler.registry import register, register_alias
from scheduler.types import Endpoint, LLMRequest

_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def check_label_key(key: str) -> str:
    """A Kubernetes label key: an optional DNS-subdomain prefix and '/', then a name of <= 63 chars."""
    prefix, _, name = key.rpartition("/")
    if "/" in key and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        raise ValueError(f"invalid label key {key!r}: the prefix must be a DNS subdomain")
    if not name or len(name) > 63 or not _NAME.match(name):
        raise ValueError(
            f"invalid label key {key!r}: the name must be 1-63 characters, alphanumeric, '-', '_' or '.', "
            "starting and ending with an alphanumeric character"
        )
    return key


def check_label_value(value: str) -> str:
    if value and (len(value) > 63 or not _NAME.match(value)):
        raise ValueError(
            f"invalid label value {value!r}: at most 63 characters, alphanumeric, '-', '_' or '.', "
            "starting and ending with an alphanumeric character"
        )
    return value


class LabelSelectorRequirement(Parameters):
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] = Field(default_factory=list)

    @field_validator("key")
    @classmethod
    def _key(cls, v: str) -> str:
        return check_label_key(v)

    @field_validator("values")
    @classmethod
    def _values(cls, v: list[str]) -> list[str]:
        for value in v:
            check_label_value(value)
        return v

    @model_validator(mode="after")
    def _values_fit_operator(self) -> LabelSelectorRequirement:
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"operator {self.operator} on key {self.key!r} needs a non-empty 'values'")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"operator {self.operator} on key {self.key!r} takes no 'values'")
        return self

    def matches(self, labels: dict[str, str]) -> bool:
        op = self.operator
        if op == "In":
            return self.key in labels and labels[self.key] in self.values
        if op == "NotIn":
            return self.key not in labels or labels[self.key] not in self.values
        if op == "Exists":
            return self.key in labels
        return self.key not in labels


class LabelSelector(Parameters):
    """A Kubernetes LabelSelector; `matches(labels)` as labels.Selector.Matches."""

    match_labels: dict[str, str] = Field(default_factory=dict, alias="matchLabels")
    match_expressions: list[LabelSelectorRequirement] = Field(default_factory=list, alias="matchExpressions")

    @field_validator("match_labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            check_label_key(key)
            check_label_value(value)
        return v

    def matches(self, labels: dict[str, str]) -> bool:
        for key, value in self.match_labels.items():
            if labels.get(key) != value:
                return False
        return all(req.matches(labels) for req in self.match_expressions)


@register
class LabelSelectorFilter(Filter):
    type_name = "label-selector-filter"
    Parameters = LabelSelector

    def filter(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        selector = self.params
        return [ep for ep in endpoints if selector.matches(ep.labels)]


register_alias("by-label-selector", LabelSelectorFilter)  # llm-d's deprecated name
