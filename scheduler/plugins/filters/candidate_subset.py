"""`candidate-subset-filter` (Ray EPP's own): bound the endpoints the scorers score, so that a
decision's cost stops growing with the pool.

Every scorer scores every endpoint it is given, so a decision costs a few µs per pod: ~2 ms at
1,000 pods (docs/SCALING.md). Most of those pods can not win: a request goes where its prefix is
cached or where the load is low. This filter keeps, of a pool larger than `maxCandidates`:

1. the endpoints that hold the longest part of the request's prefix (the prefix producer's match:
   it returns only the holders, at the cost of the prompt's blocks, not of the pool), longest
   first, at most `maxPrefixHolders`;
2. the `leastLoaded` endpoints with the fewest requests waiting, then running (one pass over the
   pool with a bounded heap);
3. a uniform random sample of the rest up to `maxCandidates`, so every endpoint keeps a chance and
   a stale metric can not hide a good one for long (the cycle's random draws, so a run is
   reproducible).

A pool of at most `maxCandidates` endpoints passes whole. Put it first in a profile, before
filters and scorers that cost per endpoint. The prefix producer is found as `no-hit-lru-scorer`
finds it (`prefixMatchInfoProducerName`, else the prefix-cache-scorer's, else the plugin called
`approx-prefix-cache-producer`); without one, a config that sets `maxPrefixHolders` above 0 is a
load-time error, and with `maxPrefixHolders: 0` none is needed."""

from __future__ import annotations

import heapq
from itertools import compress
from operator import attrgetter

from pydantic import Field, model_validator

from scheduler.cycle_state import CycleState
from scheduler.data_keys import DataKey
from scheduler.interfaces import Filter, Parameters, PluginHandle
from scheduler.plugins.scorers.no_hit_lru import find_prefix_match_key
from scheduler.plugins.support.cycle_rng import cycle_rng, salt
from scheduler.plugins.support.prefix import PREFIX_HOLDERS
from scheduler.registry import register
from scheduler.types import Endpoint, LLMRequest

_NAME = attrgetter("name")


class CandidateSubsetParameters(Parameters):
    max_candidates: int = Field(default=32, alias="maxCandidates", ge=1)
    max_prefix_holders: int = Field(default=8, alias="maxPrefixHolders", ge=0)
    least_loaded: int = Field(default=8, alias="leastLoaded", ge=0)
    prefix_match_info_producer_name: str = Field(default="", alias="prefixMatchInfoProducerName")

    @model_validator(mode="after")
    def _fits(self) -> CandidateSubsetParameters:
        if self.max_prefix_holders + self.least_loaded > self.max_candidates:
            raise ValueError("maxPrefixHolders + leastLoaded must be at most maxCandidates")
        return self


def _load(endpoint: Endpoint) -> tuple[int, int]:
    m = endpoint.metrics
    return m.waiting_queue_size, m.running_requests_size


@register
class CandidateSubsetFilter(Filter):
    type_name = "candidate-subset-filter"
    Parameters = CandidateSubsetParameters

    def setup(self, handle: PluginHandle) -> None:
        p = self.params
        self.holders_key: DataKey[dict[str, int]] | None = None
        if p.max_prefix_holders > 0:
            producer = find_prefix_match_key(handle, p.prefix_match_info_producer_name).producer
            self.holders_key = PREFIX_HOLDERS.of(producer)
            self.consumes = (self.holders_key,)
        self.rng = handle.rng
        self.rng_salt = salt(self.rng)

    def filter(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        p = self.params
        if len(endpoints) <= p.max_candidates:
            return endpoints
        chosen: dict[str, Endpoint] = {}
        if self.holders_key is not None:
            counts = cycle_state.get(self.holders_key, {})
            if counts:
                ranked = heapq.nlargest(p.max_prefix_holders, zip(counts.values(), counts, strict=True))
                keep = {name for _, name in ranked}
                for ep in compress(endpoints, map(keep.__contains__, map(_NAME, endpoints))):
                    chosen[ep.name] = ep
        added = 0
        for ep in heapq.nsmallest(p.least_loaded + len(chosen), endpoints, key=_load):
            if added == p.least_loaded:
                break
            if ep.name not in chosen:
                chosen[ep.name] = ep
                added += 1
        self._sample_rest(cycle_state, endpoints, chosen, p.max_candidates - len(chosen))
        return list(chosen.values())

    def _sample_rest(
        self, cycle_state: CycleState, endpoints: list[Endpoint], chosen: dict[str, Endpoint], room: int
    ) -> None:
        """Add `room` endpoints drawn uniformly from those not chosen yet: a random sample of the
        pool's positions, large enough to hold `room` after skipping the chosen, taken in its
        (random) order, so the cost is the sample's, not the pool's."""
        if room <= 0:
            return
        rng = cycle_rng(cycle_state, self)
        for i in rng.sample(range(len(endpoints)), min(len(endpoints), room + len(chosen))):
            ep = endpoints[i]
            if ep.name not in chosen:
                chosen[ep.name] = ep
                room -= 1
                if room == 0:
                    return
