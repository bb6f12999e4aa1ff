"""`decision-tree-filter`: filters chained as a flow chart (GIE's original filter tree,
pkg/epp/scheduling/scheduler.go and filter.go at a70d66e5; later GIE's DecisionTreeFilter).

Run `current`. If it kept some endpoints and there is a `nextOnSuccess` (or else a
`nextOnSuccessOrFailure`), continue with the *kept* endpoints; if it kept none and there is a
`nextOnFailure` (or else a `nextOnSuccessOrFailure`), continue with the *original input*;
otherwise return what `current` returned.

Parameters follow GIE's schema, where every place takes an entry naming a filter plugin
`{pluginRef: name}` or holding a sub-tree `{decisionTree: {current: ..., nextOnSuccess: ...}}`:

    current: {pluginRef: critical}
    nextOnSuccess: {decisionTree: {current: {pluginRef: low-queue}, nextOnFailure: {pluginRef: x}}}

Two shorthands are accepted as well: a bare name (`current: critical`), and a node written inline,
`{pluginRef: low-queue, nextOnFailure: x}`, meaning `{decisionTree: {current: {pluginRef: low-queue},
nextOnFailure: x}}`. A referenced plugin must be a filter; it may itself be a decision tree.

A failure that a branch handles is forgotten: if `current` recorded why it removed everything
(FILTER_FAILURE_KEY, e.g. a drop) and the tree then continues on `nextOnFailure`, that record is
undone, so only a failure that ends the tree fails the request with its code."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from scheduler.cycle_state import FILTER_FAILURE_KEY, CycleState
from scheduler.interfaces import Filter, Parameters, PluginHandle
from scheduler.registry import register
from scheduler.types import Endpoint, LLMRequest

_NEXT_FIELDS = ("nextOnSuccess", "nextOnFailure", "nextOnSuccessOrFailure")


class DecisionTreeEntry(Parameters):
    """One place in the tree: a filter by name, a sub-tree, or (shorthand) a filter with branches."""

    plugin_ref: str | None = Field(default=None, alias="pluginRef")
    decision_tree: DecisionTreeParameters | None = Field(default=None, alias="decisionTree")
    next_on_success: DecisionTreeEntry | None = Field(default=None, alias="nextOnSuccess")
    next_on_failure: DecisionTreeEntry | None = Field(default=None, alias="nextOnFailure")
    next_on_success_or_failure: DecisionTreeEntry | None = Field(default=None, alias="nextOnSuccessOrFailure")

    @model_validator(mode="before")
    @classmethod
    def _bare_name(cls, data: Any) -> Any:
        return {"pluginRef": data} if isinstance(data, str) else data

    @model_validator(mode="after")
    def _one_kind(self) -> DecisionTreeEntry:
        if self.plugin_ref is not None and self.decision_tree is not None:
            raise ValueError("both pluginRef and decisionTree may not be specified")
        if self.plugin_ref is None and self.decision_tree is None:
            raise ValueError("either pluginRef or decisionTree must be specified")
        if self.decision_tree is not None and self.has_branches:
            raise ValueError(f"{'/'.join(_NEXT_FIELDS)} go inside the decisionTree, not beside it")
        return self

    @property
    def has_branches(self) -> bool:
        return any(b is not None for b in (self.next_on_success, self.next_on_failure, self.next_on_success_or_failure))


class DecisionTreeParameters(Parameters):
    current: DecisionTreeEntry
    next_on_success: DecisionTreeEntry | None = Field(default=None, alias="nextOnSuccess")
    next_on_failure: DecisionTreeEntry | None = Field(default=None, alias="nextOnFailure")
    next_on_success_or_failure: DecisionTreeEntry | None = Field(default=None, alias="nextOnSuccessOrFailure")


DecisionTreeEntry.model_rebuild()
DecisionTreeParameters.model_rebuild()


class _Node:
    """A compiled tree node; runs like a filter."""

    __slots__ = ("current", "on_failure", "on_success")

    def __init__(self, current, on_success, on_failure) -> None:
        self.current = current
        self.on_success = on_success
        self.on_failure = on_failure

    def filter(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        had_failure = FILTER_FAILURE_KEY in cycle_state
        previous = cycle_state.read(FILTER_FAILURE_KEY)
        kept = self.current.filter(cycle_state, request, endpoints)
        if kept:
            return kept if self.on_success is None else self.on_success.filter(cycle_state, request, kept)
        if self.on_failure is None:
            return kept
        if had_failure:  # the branch handles this failure: forget what `current` recorded
            cycle_state.write(FILTER_FAILURE_KEY, previous)
        else:
            cycle_state.delete(FILTER_FAILURE_KEY)
        return self.on_failure.filter(cycle_state, request, endpoints)


@register
class DecisionTreeFilter(Filter):
    type_name = "decision-tree-filter"
    Parameters = DecisionTreeParameters

    def setup(self, handle: PluginHandle) -> None:
        if not handle.plugin_names():
            raise ValueError("a decision-tree-filter refers to other plugins: build it from a config")
        self._handle = handle
        self._root = self._compile(self.params, "parameters")
        self._handle = None  # only needed while building

    def filter(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        return self._root.filter(cycle_state, request, endpoints)

    def describe(self) -> dict[str, Any]:
        """The compiled tree by plugin name: {current, onSuccess, onFailure}, branches None where the
        tree stops (nextOnSuccessOrFailure shows as both)."""
        return _describe(self._root)

    def _compile(self, node: DecisionTreeParameters | DecisionTreeEntry, where: str) -> _Node:
        if isinstance(node, DecisionTreeParameters):
            current = self._entry(node.current, f"{where}.current")
        else:  # the inline shorthand: the entry's own plugin with its branches
            current = self._plugin(node.plugin_ref, f"{where}.pluginRef")
        either = self._branch(node.next_on_success_or_failure, f"{where}.nextOnSuccessOrFailure", None)
        success = self._branch(node.next_on_success, f"{where}.nextOnSuccess", either)
        failure = self._branch(node.next_on_failure, f"{where}.nextOnFailure", either)
        return _Node(current, success, failure)

    def _branch(self, entry: DecisionTreeEntry | None, where: str, otherwise):
        return otherwise if entry is None else self._entry(entry, where)

    def _entry(self, entry: DecisionTreeEntry, where: str):
        if entry.decision_tree is not None:
            return self._compile(entry.decision_tree, f"{where}.decisionTree")
        if entry.has_branches:
            return self._compile(entry, where)
        return self._plugin(entry.plugin_ref, f"{where}.pluginRef")

    def _plugin(self, name: str | None, where: str) -> Filter:
        try:
            plugin = self._handle.plugin(name)
        except KeyError:
            raise ValueError(f"{where}: {name!r} is a reference to an undefined plugin") from None
        if not isinstance(plugin, Filter):
            raise ValueError(f"{where}: {name!r} (type {plugin.type_name}) is not a filter")
        return plugin


def _describe(step) -> Any:
    if isinstance(step, _Node):
        return {
            "current": _describe(step.current),
            "onSuccess": None if step.on_success is None else _describe(step.on_success),
            "onFailure": None if step.on_failure is None else _describe(step.on_failure),
        }
    return step.name
