"""The decision trace a debug request asks for: per profile, what each filter kept, every scorer's
score per endpoint, and the pick. Built only when asked for; plain dicts so it travels as JSON."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Where plugins that run outside a profile (the profile handler, P/D deciders) leave what a trace
# should show of their decisions: a dict in the request's CycleState, merged into the trace's top level.
TRACE_NOTES_KEY = "scheduler/trace-notes"


def add_trace_note(cycle_state: Any, key: str, value: Any) -> None:
    """Record `value` under `key` in the trace of this request (if one is taken)."""
    notes = cycle_state.read(TRACE_NOTES_KEY)
    if notes is None:
        notes = {}
        cycle_state.write(TRACE_NOTES_KEY, notes)
    notes[key] = value


@dataclass(slots=True)
class ProfileTrace:
    profile: str
    filters: list[dict[str, Any]] = field(default_factory=list)
    scorers: list[dict[str, Any]] = field(default_factory=list)
    totals: dict[str, float] = field(default_factory=dict)
    picked: list[str] = field(default_factory=list)
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "filters": self.filters,
            "scorers": self.scorers,
            "totals": self.totals,
            "picked": self.picked,
            "error": self.error,
        }


@dataclass(slots=True)
class SchedulingTrace:
    rounds: list[list[str]] = field(default_factory=list)
    profiles: dict[str, dict[str, Any]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"rounds": self.rounds, "profiles": self.profiles, **self.extra}
