"""`lora-residency-scorer` (Ray EPP): prefer endpoints where the requested LoRA adapter is
resident, judged by what the endpoint reports *and* by where this scheduler recently sent the
adapter; let an adapter take a free slot on another endpoint only while its share of the traffic
warrants more endpoints than it is on.

Why: vLLM's `vllm:lora_requests_info` lists an adapter (`running_lora_adapters`, our
`Metrics.active_models`) only while a request for it is running. An adapter that is loaded on a
server but momentarily idle looks absent, so GIE's `lora-affinity-scorer` may send its next
request to another server, which then loads it (stalling that server's whole batch) and may evict
another adapter. A model server keeps an adapter until it needs the slot for another (vLLM evicts
the least recently used), so where an adapter was sent is a good guess of where it still is.

**Resident set.** Each endpoint's resident adapters are estimated as an LRU of
`max_active_models` slots, filled in this order:

1. adapters this scheduler sent there after the endpoint's metrics were last reported
   (`reported_at` where the datastore judged freshness, else `update_time`), which the
   metrics cannot show yet;
2. the adapters the metrics list as running or waiting there;
3. adapters sent there before that scrape, most recently sent first, while slots remain.

An adapter not sent to an endpoint within `window` is forgotten there (the metrics still count).

**Spread.** An adapter carrying a share `s` of the recent requests (counts decayed with half-life
`popularityHalfLife`) warrants `ceil(spread * s * N)` of the `N` candidate endpoints: with
`spread` 1 its endpoints each carry no more than an endpoint's fair share of the traffic. While it
is on fewer candidates than that (or on none), a free slot scores `freeSlotScore`; once it is on
enough, a free slot scores `spareSlotScore`, so that load must be much more uneven to move its
traffic to a new endpoint. This keeps a popular adapter's traffic spread over a few endpoints
without copying every adapter into every free slot.

**Score** of an endpoint for the requested adapter: 1 when resident, `freeSlotScore` or
`spareSlotScore` when a slot is free, 0 when serving it would evict another adapter.

Only models some endpoint has reported (running or waiting) count as adapters: the base model
never shows in those lists, so it takes no slot in the estimate and gets no affinity. A brand-new
adapter is therefore scored by the metrics alone until a scrape first shows it (one interval).

PreRequest learns the first target of every profile result (each loads the adapter: in P/D, both
the prefill and the decode server). Memory is per plugin instance: in the Ray path, per profile
actor, each told every decision."""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Annotated

from pydantic import BeforeValidator, Field, model_validator

from scheduler.cycle_state import CycleState
from scheduler.duration import duration_seconds
from scheduler.interfaces import Parameters, PluginHandle, PreRequest, Scorer, ScorerCategory
from scheduler.registry import register
from scheduler.types import Endpoint, LLMRequest, Metrics, SchedulingResult

Seconds = Annotated[float, BeforeValidator(duration_seconds)]

RESIDENT = 1.0
EVICTS = 0.0
MEMORY_CAP = 64  # models remembered per endpoint, whatever its slot count
POPULARITY_CAP = 1024  # models whose request rate is tracked; the faded ones go first


class LoraResidencyParameters(Parameters):
    # Go duration strings in config ("30s", "10m"); seconds once loaded.
    window: Seconds = Field(default=600.0, alias="window", gt=0.0)
    popularity_half_life: Seconds = Field(default=30.0, alias="popularityHalfLife", gt=0.0)
    spread: float = Field(default=1.5, alias="spread", gt=0.0)
    free_slot_score: float = Field(default=0.8, alias="freeSlotScore", ge=0.0, le=1.0)
    spare_slot_score: float = Field(default=0.5, alias="spareSlotScore", ge=0.0, le=1.0)

    @model_validator(mode="after")
    def _spare_not_above_free(self) -> LoraResidencyParameters:
        if self.spare_slot_score > self.free_slot_score:
            raise ValueError("spareSlotScore must not exceed freeSlotScore")
        return self


@register
class LoraResidencyScorer(Scorer, PreRequest):
    type_name = "lora-residency-scorer"
    category = ScorerCategory.AFFINITY
    Parameters = LoraResidencyParameters

    def setup(self, handle: PluginHandle) -> None:
        # Unix seconds: "sent" times are compared with the metrics' report time, written in them.
        self.clock: Callable[[], float] = handle.wall_clock
        self._lock = threading.Lock()
        # endpoint name -> model -> when this scheduler last sent it there (least recent first).
        self._sent: dict[str, OrderedDict[str, float]] = {}
        # Models some endpoint has reported running or waiting: adapters, not the base model.
        self._adapters: set[str] = set()
        # model -> (decayed request count, as of when); None -> all requests.
        self._counts: dict[str | None, tuple[float, float]] = {}

    def resident(self, endpoint: Endpoint) -> list[str]:
        """The adapters estimated resident on the endpoint, most certain first."""
        with self._lock:
            self._learn_adapters([endpoint])
            return self._resident(endpoint.name, endpoint.metrics, self.clock() - self.params.window)

    def share(self, model: str) -> float:
        """The model's share of the requests scheduled recently (0 when none were)."""
        with self._lock:
            return self._share(model, self.clock())

    def score(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> dict[Endpoint, float]:
        model = request.target_model
        p = self.params
        with self._lock:
            self._learn_adapters(endpoints)
            now = self.clock()
            resident = {ep: self._resident(ep.name, ep.metrics, now - p.window) for ep in endpoints}
            free = p.free_slot_score
            if model in self._adapters:
                on = sum(1 for ep in endpoints if model in resident[ep])
                wanted = math.ceil(p.spread * self._share(model, now) * len(endpoints) - 1e-9)
                if on >= max(1, wanted):
                    free = p.spare_slot_score
        scores: dict[Endpoint, float] = {}
        for ep in endpoints:
            if model in resident[ep]:
                scores[ep] = RESIDENT
            elif len(resident[ep]) < ep.metrics.max_active_models:
                scores[ep] = free
            else:
                scores[ep] = EVICTS
        return scores

    def pre_request(self, request: LLMRequest, result: SchedulingResult) -> None:
        names = [r.target_endpoints[0].name for r in result.profile_results.values() if r and r.target_endpoints]
        model = request.target_model
        now = self.clock()
        with self._lock:
            self._count(model, now)
            self._count(None, now)
            for name in names:
                sent = self._sent.setdefault(name, OrderedDict())
                sent[model] = now
                sent.move_to_end(model)
                while len(sent) > MEMORY_CAP:
                    sent.popitem(last=False)

    def _learn_adapters(self, endpoints: list[Endpoint]) -> None:
        for ep in endpoints:
            self._adapters.update(ep.metrics.active_models)
            self._adapters.update(ep.metrics.waiting_models)

    def _resident(self, name: str, metrics: Metrics, since: float) -> list[str]:
        reported = list(dict.fromkeys([*metrics.active_models, *metrics.waiting_models]))
        sent = self._sent.get(name)
        if not sent:
            return reported
        while sent:  # forget what was sent longer than `window` ago (least recent first)
            model, at = next(iter(sent.items()))
            if at >= since:
                break
            del sent[model]
        # When the metrics were reported (0: unknown, so nothing counts as newer than them).
        scraped = metrics.reported_at or metrics.update_time or float("inf")
        fresh: list[str] = []  # sent since the scrape
        older: list[str] = []  # sent before it, most recent first
        for model, at in reversed(sent.items()):
            if model in self._adapters:
                (fresh if at > scraped else older).append(model)
        out = fresh + [m for m in reported if m not in fresh]
        room = metrics.max_active_models - len(out)
        if room > 0:
            seen = set(out)
            out += [m for m in older if m not in seen][:room]
        return out

    def _decayed(self, key: str | None, now: float) -> float:
        count, at = self._counts.get(key, (0.0, now))
        return count * 0.5 ** (max(0.0, now - at) / self.params.popularity_half_life)

    def _count(self, key: str | None, now: float) -> None:
        self._counts[key] = (self._decayed(key, now) + 1.0, now)
        if len(self._counts) > POPULARITY_CAP:
            faded = min((k for k in self._counts if k is not None), key=lambda k: self._decayed(k, now))
            del self._counts[faded]

    def _share(self, model: str, now: float) -> float:
        total = self._decayed(None, now)
        return self._decayed(model, now) / total if total > 0 else 0.0
