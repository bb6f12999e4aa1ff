"""The decision trace a debug request asks for: per profile, what each filter kept, every scorer's
score per endpoint, and the pick. Built only when asked for; plain dicts so it travels as JSON."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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
