"""What this process's `EPPRequestRouter`s did: their counters, their last decisions, and the sums
and percentiles `router_stats()` reports (e.g. from an ingress replica, or a benchmark's driver).

Routers register themselves here (`register`); the registry holds weak references, so a router
Serve dropped leaves it. The registry lives in the imported module: Serve ships the router class
with cloudpickle, whose copy of these functions may have module globals of its own."""

from __future__ import annotations

import importlib
import weakref
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Protocol

TIMING_SAMPLES = 10_000  # choose_replicas durations (and routing delays) kept per router
RECENT_DECISIONS = 1_000  # routed requests kept per router, for `recent_decisions()`


@dataclass(slots=True)
class RouterCounters:
    """What one router did; `router_stats()` sums the routers of this process."""

    scheduled: int = 0  # decided by the scheduler
    fallbacks: Counter = field(default_factory=Counter)  # reason -> Serve's own choice instead
    routed: int = 0  # on_request_routed seen
    routed_not_first: int = 0  # Serve sent it past the scheduler's first target (back-pressure)
    completed: int = 0  # completions sent to the profile actors
    schedule_s: float = 0.0  # total time in choose_replicas' scheduling
    # Decisions taken while an earlier decision of this router was not yet routed: Serve reports a
    # request routed only after the replica accepted it (a round trip), so such a decision could
    # not see the earlier one, unless the router learns its decisions when it makes them.
    decided_unseen: int = 0
    first_tokens_inferred: int = 0  # from the replicas' published queues (serve_app/llm_router/first_token.py)
    refused: int = 0  # requests failed because the router refused its config (serve_app/llm_router/router_config.py)
    choose_s: deque[float] = field(default_factory=lambda: deque(maxlen=TIMING_SAMPLES))  # per call
    # choose_replicas' answer to on_request_routed, per routed request (Serve's rejection round trip)
    routed_after_s: deque[float] = field(default_factory=lambda: deque(maxlen=TIMING_SAMPLES))
    recent: deque[RoutedRequest] = field(default_factory=lambda: deque(maxlen=RECENT_DECISIONS))

    def as_dict(self) -> dict[str, Any]:
        return {
            "scheduled": self.scheduled,
            "fallbacks": dict(self.fallbacks),
            "fallback_total": sum(self.fallbacks.values()),
            "routed": self.routed,
            "routed_not_first": self.routed_not_first,
            "completed": self.completed,
            "schedule_s": self.schedule_s,
            "decided_unseen": self.decided_unseen,
            "first_tokens_inferred": self.first_tokens_inferred,
            "refused": self.refused,
        }


@dataclass(slots=True, frozen=True)
class RoutedRequest:
    """One request as Serve carried it out: where it went and who chose ("scheduled": the scheduler's
    first target; "moved": a later target, back-pressure refused the first; "fallback": Serve's)."""

    request_id: str
    model: str
    replica: str
    how: str
    at: float


class CountedRouter(Protocol):
    """What the registry reads of a router."""

    counters: RouterCounters
    mirror: Any  # serve_app.llm_router.mirror.RouterMirror: its `counters`


def _registry() -> list[weakref.ref[CountedRouter]]:
    return vars(importlib.import_module(__name__)).setdefault("_ROUTERS", [])


def register(router: CountedRouter) -> None:
    """Count `router` in this process's stats (until it is garbage)."""
    registry = _registry()
    registry[:] = [r for r in registry if r() is not None] + [weakref.ref(router)]


def routers() -> list[Any]:
    """This process's live routers."""
    return [r for ref in list(_registry()) if (r := ref()) is not None]


def router_stats() -> dict[str, Any]:
    """The summed counters of every EPPRequestRouter in this process (e.g. an ingress replica's)."""
    live = routers()
    total: dict[str, Any] = {"routers": len(live), "fallbacks": Counter()}
    for router in live:
        counts = router.counters.as_dict()
        total["fallbacks"].update(counts.pop("fallbacks"))
        for key, value in counts.items():
            total[key] = total.get(key, 0) + value
    total["fallbacks"] = dict(total["fallbacks"])
    total["choose_ms"] = percentiles_ms([s for router in live for s in router.counters.choose_s])
    total["routed_after_ms"] = percentiles_ms([s for router in live for s in router.counters.routed_after_s])
    mirror: Counter = Counter()
    for router in live:
        mirror.update(router.mirror.counters.as_dict())
    total["mirror"] = dict(mirror) | {
        "lag_ms": percentiles_ms([s for router in live for s in router.mirror.counters.lag_s])
    }
    return total


def percentiles_ms(samples_s: list[float]) -> dict[str, Any]:
    """n, p50, p90, p99 in milliseconds of durations in seconds (None when there are none)."""
    samples = sorted(samples_s)
    return {"n": len(samples)} | {
        f"p{q}": 1e3 * samples[min(len(samples) - 1, len(samples) * q // 100)] if samples else None
        for q in (50, 90, 99)
    }


def recent_decisions(limit: int = 100) -> list[RoutedRequest]:
    """The last `limit` requests this process's routers sent, oldest first."""
    merged = sorted((d for router in routers() for d in router.counters.recent), key=lambda d: d.at)
    return merged[-limit:]
