"""The legacy "least" bucket rule shared by `least-queue-filter` and `least-kv-cache-filter` (a helper,
not a plugin).

GIE's leastQueuingFilterFunc / leastKVCacheFilterFunc: split the range [min, max] of a metric over
the candidates into len(candidates) equal buckets and keep the endpoints in the lowest one, i.e.
min <= v <= min + (max - min) / len(candidates). Keeping a band rather than only the minimum
leaves the next filter a choice, which GIE found better on aggregate."""

from __future__ import annotations

from collections.abc import Callable

from scheduler.cycle_state import CycleState
from scheduler.interfaces import Filter
from scheduler.types import Endpoint, LLMRequest


def lowest_bucket(endpoints: list[Endpoint], value: Callable[[Endpoint], float], integral: bool) -> list[Endpoint]:
    """The endpoints whose value lies in the lowest of len(endpoints) buckets over [min, max].

    `integral` divides as Go's int division does (queue lengths), else as floats (KV usage).
    As in GIE the maximum starts at 0, so it is never below 0."""
    if not endpoints:
        return []
    values = [value(ep) for ep in endpoints]
    lo = min(values)
    hi = max(max(values), 0)
    width = (hi - lo) // len(values) if integral else (hi - lo) / len(values)
    limit = lo + width
    return [ep for ep, v in zip(endpoints, values, strict=True) if lo <= v <= limit]


class LeastBucketFilter(Filter):
    """Base of the two "least" filters: subclasses say which metric and how it divides."""

    integral = False

    @staticmethod
    def metric(endpoint: Endpoint) -> float:
        raise NotImplementedError

    def filter(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        return lowest_bucket(endpoints, self.metric, self.integral)
