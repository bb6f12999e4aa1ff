"""Plugins for framework tests: a filter/scorer/picker that does what it is told and counts its
calls (GIE's testPlugin), a pass-through filter that records what it saw, and a profile handler
that plays a script of rounds."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scheduler import (
    CycleState,
    Endpoint,
    Filter,
    LLMRequest,
    Picker,
    ProfileHandler,
    ProfileRunResult,
    SchedulingResult,
    ScoredEndpoint,
    Scorer,
)


class FakePlugin(Filter, Scorer, Picker):
    """Keeps the endpoints named in `keep`, scores every endpoint `score`, picks the one named `pick`."""

    type_name = "fake"

    def __init__(self, name: str, keep: list[str] | None = None, score: float = 0.0, pick: str = "") -> None:
        super().__init__(name)
        self.keep, self.score_value, self.pick_name = keep or [], score, pick
        self.filter_calls = self.score_calls = self.pick_calls = 0
        self.num_scored = self.num_pick_candidates = 0
        self.winner_score: float | None = None

    def filter(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        self.filter_calls += 1
        return [ep for ep in endpoints if ep.name in self.keep]

    def score(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> dict[Endpoint, float]:
        self.score_calls += 1
        self.num_scored = len(endpoints)
        return dict.fromkeys(endpoints, self.score_value)

    def pick(self, cycle_state: CycleState, scored: list[ScoredEndpoint]) -> ProfileRunResult:
        self.pick_calls += 1
        self.num_pick_candidates = len(scored)
        winners = [s for s in scored if s.endpoint.name == self.pick_name]
        for s in winners:
            self.winner_score = s.score
        return ProfileRunResult([s.endpoint for s in winners])


class RecordingFilter(Filter):
    """Passes every endpoint through and appends (its name, how many it received) to `log`."""

    type_name = "recording-filter"

    def __init__(self, name: str, log: list[tuple[str, int]]) -> None:
        super().__init__(name)
        self.log = log

    def filter(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        self.log.append((self.name, len(endpoints)))
        return endpoints


class ScriptedHandler(ProfileHandler):
    """Picks the profiles of `rounds[i]` in round i (then nothing), recording the results it was
    shown each time; the primary profile is `primary`. With `forever`, it never stops picking."""

    type_name = "scripted-handler"

    def __init__(self, rounds: list[list[str]], primary: str, forever: bool = False) -> None:
        super().__init__("scripted")
        self.rounds, self.primary, self.forever = rounds, primary, forever
        self.seen: list[dict[str, Any]] = []

    def pick(
        self,
        cycle_state: CycleState,
        request: LLMRequest,
        profiles: Mapping[str, Any],
        results: Mapping[str, ProfileRunResult | None],
    ) -> dict[str, Any]:
        self.seen.append(dict(results))
        i = len(self.seen) - 1
        if self.forever:
            return {self.rounds[0][0]: profiles[self.rounds[0][0]]}
        if i >= len(self.rounds):
            return {}
        return {name: profiles.get(name) for name in self.rounds[i]}

    def process_results(
        self, cycle_state: CycleState, request: LLMRequest, results: Mapping[str, ProfileRunResult | None]
    ) -> SchedulingResult:
        return SchedulingResult(dict(results), self.primary)
