"""Min-max score scaling shared by the metric scorers (not a plugin)."""

from __future__ import annotations

from collections.abc import Sequence

from scheduler.types import Endpoint


def fewer_is_better(endpoints: Sequence[Endpoint], values: Sequence[float]) -> dict[Endpoint, float]:
    """Min-max normalise one value per endpoint so the smallest scores 1 and the largest 0.

    When every value is the same, every endpoint scores 1 (GIE's neutral score)."""
    if not endpoints:
        return {}
    lo, hi = min(values), max(values)
    if hi == lo:
        return dict.fromkeys(endpoints, 1.0)
    span = hi - lo
    return {ep: (hi - v) / span for ep, v in zip(endpoints, values, strict=True)}
