"""`prefix-home-balance-scorer` (Ray EPP): send a request whose prompt no endpoint holds ("cold": no
matched prefix block on any candidate) to the endpoint whose cache, by the router's prefix index,
holds the least, so the homes of prefix groups spread evenly over the pool.

Why: a cold request's endpoint becomes its prefix's home. Every later request of that group follows
the prefix there (`prefix-cache-scorer`), so one cold decision sets where a share of the traffic goes
for as long as the group lives. The load scorers judge the next few milliseconds: when a group's
first request arrives, an endpoint that is already home to one group more than another may look as
idle, and with ledgers that fade as prompts near their first token (`prefill-eta-scorer`) a home
rarely shows a backlog, so its group never spills and the endpoint with a group too many is the
pool's slowest tenth (docs/decisions/0007-default-fading-ledger.md). SGLang's
cache-aware router settles the same choice by the smallest per-worker radix tree.

The signal is the number of blocks the index holds per endpoint (what this router sent there and
has not aged out of the endpoint's LRU, sized to its KV cache). A new group's first prompt is mostly
its shared prefix, so while groups are born an endpoint's block count follows the prefixes it is home
to. Cold: each endpoint scores 1 - blocks / the most any candidate holds (the emptiest near 1, the
fullest 0; all equal, or an empty index, score 1). Warm (some candidate holds part of the prompt):
every endpoint scores 1, leaving the choice to prefix affinity and load. Relative, not min-max
(`normalize: min-max`, the first form): on conversation traffic (ShareGPT) nearly every first turn
is cold while the pods' holdings differ by 1-5 %, and on a pool that clients also use directly most
prompts are cold; min-max made that history-sized gap decide every one of them
(docs/decisions/0007-default-fading-ledger.md, "More seeds"). Nothing is kept per request; the
index is the prefix-cache producer's (found as `no-hit-lru-scorer` finds it), which learns each
decision and writes its holdings under PREFIX_INDEX_HOLDINGS for the cycle; a producer without an
index (the burst producer), or a cycle without that key (the producer failed), scores 1 everywhere."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from scheduler.cycle_state import CycleState
from scheduler.data_keys import DataKey
from scheduler.interfaces import Parameters, PluginHandle, Scorer, ScorerCategory
from scheduler.plugins.scorers.no_hit_lru import find_prefix_match_key
from scheduler.plugins.support.prefix import PREFIX_INDEX_HOLDINGS, IndexHoldings
from scheduler.registry import register
from scheduler.types import Endpoint, LLMRequest


class PrefixHomeBalanceParameters(Parameters):
    prefix_plugin_name: str = Field(default="prefix-cache-scorer", alias="prefixPluginName")
    prefix_match_info_producer_name: str = Field(default="", alias="prefixMatchInfoProducerName")
    # relative: 1 - blocks / the most any candidate holds, so a gap of a few per cent scores a few
    # per cent. min-max (the behaviour until 2026-12-04): the endpoint holding least scores 1, the
    # most 0, however small the gap.
    normalize: Literal["relative", "min-max"] = "relative"


@register
class PrefixHomeBalanceScorer(Scorer):
    type_name = "prefix-home-balance-scorer"
    category = ScorerCategory.DISTRIBUTION
    Parameters = PrefixHomeBalanceParameters

    def setup(self, handle: PluginHandle) -> None:
        p = self.params
        self.match_key = find_prefix_match_key(handle, p.prefix_match_info_producer_name, p.prefix_plugin_name)
        self.holdings_key: DataKey[IndexHoldings] | None = PREFIX_INDEX_HOLDINGS.of(self.match_key.producer)
        producer = self.match_key.producer
        if producer in handle.plugin_names() and self.holdings_key in getattr(handle.plugin(producer), "produces", ()):
            self.consumes = (self.match_key, self.holdings_key)
        else:  # a producer with no index to weigh
            self.consumes, self.holdings_key = (self.match_key,), None

    def score(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> dict[Endpoint, float]:
        infos = cycle_state.get(self.match_key, {})
        holdings = cycle_state.get(self.holdings_key) if self.holdings_key is not None else None
        if holdings is None or any((i := infos.get(ep.name)) is not None and i.match_blocks > 0 for ep in endpoints):
            return dict.fromkeys(endpoints, 1.0)
        size = holdings.blocks
        held = [size(ep.name) for ep in endpoints]
        low, high = (min(held), max(held)) if held else (0, 0)
        if high == low:
            return dict.fromkeys(endpoints, 1.0)
        span = high - low
        if self.params.normalize == "relative":
            return {ep: (high - blocks) / high for ep, blocks in zip(endpoints, held, strict=True)}
        return {ep: (high - blocks) / span for ep, blocks in zip(endpoints, held, strict=True)}
