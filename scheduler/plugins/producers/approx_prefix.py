"""`approx-prefix-cache-producer`: how much of a request's prompt each endpoint probably holds in its
KV cache, from an index of what each server was sent before (llm-d's approximate prefix producer,
pkg/epp/framework/plugins/requestcontrol/dataproducer/approximateprefix).

A Producer: before the profile's filters it writes a PrefixCacheMatchInfo per endpoint under its
PREFIX_MATCH_INFO key, which `prefix-cache-scorer` (and the other prefix-aware plugins) read when
their `prefixMatchInfoProducerName` names this plugin, and attaches each to its endpoint
(PREFIX_MATCH_KEY), which the P/D decider reads from the decode target, and its index's holdings per
server (PREFIX_INDEX_HOLDINGS, read by `prefix-home-balance-scorer`). It is also a PreRequest
hook: once a request is scheduled, the index learns that the primary target, and the `prefill`
profile's target in P/D, now hold its blocks (once per request).

As in llm-d, a block is at least 64 tokens (a smaller `blockSizeTokens`, or an engine's smaller
reported block size under autoTune, is raised to 64), and by default at most 131072 prompt tokens are
matched. The scorer's older combined form (GIE's prefix plugin) is expanded by the config loader into
a `gie-prefix-cache-producer` (scheduler/plugins/producers/gie_prefix.py): this class with GIE's
geometry, no 64-token floor, 256 blocks.

Bound to a recorder (`bind_metrics`: in a profile actor), it exports llm-d's prefix-indexer
families: the index's size (entries over every server's LRU), and per scheduled request the
match on the chosen endpoint as a ratio of the prompt's blocks and in bytes (4 a token, llm-d's
figure), observed where the decision is learned and only by the instance that matched for the
primary profile (in P/D, the decode profile's; outside a profile, the one whose match covered the
target). Per request awaiting its decision it keeps the holders' matches only, not one per endpoint."""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from operator import attrgetter
from typing import ClassVar

from pydantic import Field, model_validator

from scheduler.body_fields import CACHE_SALT_FIELDS, PROMPT_FIELDS
from scheduler.cycle_state import RUNNING_PROFILE, CycleState
from scheduler.data_keys import DataKey
from scheduler.interfaces import Parameters, PluginHandle, PluginMetrics, PreRequest, Producer
from scheduler.plugins.support.prefix import (
    PREFIX_HOLDERS,
    PREFIX_INDEX_HOLDINGS,
    PREFIX_MATCH_INFO,
    PREFIX_MATCH_KEY,
    IndexHoldings,
    PrefixCacheMatchInfo,
    PrefixIndex,
    prefix_block_hashes,
)
from scheduler.registry import register
from scheduler.types import Endpoint, LLMRequest, SchedulingResult

PREFILL_PROFILE = "prefill"  # llm-d's name of the profile whose target also gets the prompt's blocks
INACTIVE_SERVER_CHECK_SECONDS = 120.0
MIN_BLOCK_SIZE_TOKENS = 64  # llm-d raises smaller block sizes to this (llm-d-router issue 1158)
UNLIMITED_BLOCKS = sys.maxsize
INDEX_SIZE = "llm_d_epp_prefix_indexer_size"
HIT_RATIO = "llm_d_epp_prefix_indexer_hit_ratio"
HIT_BYTES = "llm_d_epp_prefix_indexer_hit_bytes"
CHARS_PER_TOKEN = 4  # llm-d's averageCharactersPerToken: hit bytes = matched blocks x block size x 4
MATCHES_KEPT = 4096  # matches awaiting their decision (a request that fails never sends one)

_name = attrgetter("name")


def learned_targets(result: SchedulingResult) -> list[Endpoint]:
    """The endpoints a decision sends the prompt's blocks to: the primary target, and the `prefill`
    profile's target in P/D (llm-d's rule); none when the primary profile chose nobody."""
    primary = result.profile_results.get(result.primary_profile_name)
    if primary is None or not primary.target_endpoints:
        return []
    targets = [primary.target_endpoints[0]]
    prefill_name = result.prefill_profile_name or PREFILL_PROFILE
    if result.primary_profile_name != prefill_name:
        prefill = result.profile_results.get(prefill_name)
        if prefill is not None and prefill.target_endpoints:
            targets.append(prefill.target_endpoints[0])
    return targets


class ApproxPrefixCacheParameters(Parameters):
    """llm-d's parameters and defaults. `blockSize` is the deprecated spelling of blockSizeTokens."""

    auto_tune: bool = Field(default=True, alias="autoTune")
    block_size_tokens: int = Field(default=16, alias="blockSizeTokens")
    block_size: int = Field(default=0, alias="blockSize", ge=0)
    max_prefix_blocks_to_match: int = Field(default=2048, alias="maxPrefixBlocksToMatch", ge=0)
    max_prefix_tokens_to_match: int = Field(default=131072, alias="maxPrefixTokensToMatch", ge=0)
    lru_capacity_per_server: int = Field(default=31250, alias="lruCapacityPerServer", ge=0)

    @model_validator(mode="after")
    def _check(self) -> ApproxPrefixCacheParameters:
        if not self.auto_tune and self.block_size_tokens <= 0 and self.block_size <= 0:
            raise ValueError(f"blockSizeTokens must be > 0 when autoTune is false (got {self.block_size_tokens})")
        return self


@dataclass(slots=True)
class _PendingMatch:
    """A request's match, kept for the hit metrics until its decision: the profiles it was matched
    for (or, outside a profile, the endpoints it covered) and the endpoints that held any of it."""

    zero: PrefixCacheMatchInfo
    profiles: set[str] = field(default_factory=set)
    covered: set[str] = field(default_factory=set)
    holders: dict[str, PrefixCacheMatchInfo] = field(default_factory=dict)


@register
class ApproxPrefixCacheProducer(Producer, PreRequest):
    type_name = "approx-prefix-cache-producer"
    body_fields = PROMPT_FIELDS | CACHE_SALT_FIELDS  # the prompt's block hashes
    Parameters = ApproxPrefixCacheParameters
    # llm-d's prefix_indexer families are this producer's; the precise one (a subclass) has none.
    exports_indexer_metrics: ClassVar[bool] = True

    def setup(self, handle: PluginHandle) -> None:
        p: ApproxPrefixCacheParameters = self.params
        block = p.block_size if p.block_size > 0 and p.block_size_tokens == 16 else p.block_size_tokens
        self.configure(
            auto_tune=p.auto_tune,
            block_size_tokens=block,
            max_prefix_blocks=p.max_prefix_blocks_to_match or UNLIMITED_BLOCKS,
            max_prefix_tokens=p.max_prefix_tokens_to_match,
            lru_capacity=p.lru_capacity_per_server,
            min_block_size_tokens=MIN_BLOCK_SIZE_TOKENS,
            clock=handle.clock,
        )

    def configure(
        self,
        *,
        auto_tune: bool,
        block_size_tokens: int,
        max_prefix_blocks: int,
        max_prefix_tokens: int,
        lru_capacity: int,
        min_block_size_tokens: int,
        clock: Callable[[], float],
    ) -> None:
        """`clock`: monotonic seconds for the idle-server sweep, the handle's (virtual in the simulation)."""
        self.auto_tune = auto_tune
        self.default_block_size_tokens = block_size_tokens
        self.min_block_size_tokens = min_block_size_tokens
        self.max_prefix_blocks = max_prefix_blocks
        self.max_prefix_tokens = max_prefix_tokens
        self.lru_capacity = lru_capacity
        self.index = PrefixIndex(lru_capacity)
        self.clock = clock
        self.inactive_check_seconds = INACTIVE_SERVER_CHECK_SECONDS
        self.next_check: float | None = None  # the first sweep is a check interval after the first call
        self.unseen: set[str] = set()  # indexed servers not yet seen in this check interval
        self.holdings = IndexHoldings(self.index)
        self.produces = (
            PREFIX_MATCH_INFO.of(self.name),
            PREFIX_HOLDERS.of(self.name),
            PREFIX_INDEX_HOLDINGS.of(self.name),
        )
        # Per request, in its derived data: the (block size, max blocks) it was matched with, for learn().
        self.state_key: DataKey[tuple[int, int]] = DataKey(f"{self.type_name}/geometry", self.name)
        self._learned_key: DataKey[bool] = DataKey(f"{self.type_name}/learned", self.name)
        # Per cycle: (block size, max blocks, matched blocks per holder), one index match per cycle.
        self._match_key: DataKey[tuple[int, int, dict[str, int]]] = DataKey(f"{self.type_name}/match", self.name)
        self._metrics: PluginMetrics | None = None
        self._metric_labels = self.metric_labels()
        self._matches: OrderedDict[str, _PendingMatch] = OrderedDict()

    # -- metrics -------------------------------------------------------------------------------

    def metric_labels(self) -> tuple[str, str]:
        """(plugin name, type) of the prefix-indexer families."""
        return (self.name, self.type_name)

    def bind_metrics(self, metrics: PluginMetrics) -> None:
        if not self.exports_indexer_metrics or self._metrics is metrics:
            return
        self._metrics = metrics
        labels = self._metric_labels
        metrics.add_collector(lambda: {(INDEX_SIZE, labels): float(self.index.entries())})

    def _remember_match(
        self, cycle_state: CycleState, request_id: str, infos: dict[str, PrefixCacheMatchInfo], total: int, size: int
    ) -> None:
        matches = self._matches
        pending = matches.get(request_id)
        if pending is None:
            pending = matches[request_id] = _PendingMatch(PrefixCacheMatchInfo(0, total, size))
        profile = cycle_state.get(RUNNING_PROFILE)
        if profile is None:
            pending.covered.update(infos)
        else:
            pending.profiles.add(profile)
        pending.holders.update((name, info) for name, info in infos.items() if info.match_blocks)
        if len(matches) > MATCHES_KEPT:
            matches.popitem(last=False)

    def _observe_hit(self, metrics: PluginMetrics, request_id: str, result: SchedulingResult, target: str) -> None:
        pending = self._matches.pop(request_id, None)
        if pending is None:  # not matched here, or long ago
            return
        if pending.profiles:
            if result.primary_profile_name not in pending.profiles:  # another profile's actor chose it
                return
        elif target not in pending.covered:
            return
        info = pending.holders.get(target, pending.zero)
        metrics.observe(HIT_BYTES, info.match_tokens * CHARS_PER_TOKEN, self._metric_labels)
        if info.total_blocks:
            metrics.observe(HIT_RATIO, info.match_blocks / info.total_blocks, self._metric_labels)

    # -- the block geometry -------------------------------------------------------------------

    def block_size_for(self, endpoints: list[Endpoint]) -> int:
        """Tokens per block: with autoTune the first endpoint's reported cache block size, else
        blockSizeTokens; never below the floor."""
        size = self.default_block_size_tokens
        if self.auto_tune and endpoints:
            reported = endpoints[0].metrics.cache_block_size
            if reported > 0:
                size = reported
        return max(size, self.min_block_size_tokens)

    def max_blocks_for(self, block_size_tokens: int) -> int:
        """maxPrefixTokensToMatch / block size when set, else maxPrefixBlocksToMatch."""
        if self.max_prefix_tokens > 0:
            return self.max_prefix_tokens // block_size_tokens
        return self.max_prefix_blocks

    def geometry(self, endpoints: list[Endpoint]) -> tuple[int, int]:
        """(block size in tokens, max blocks) for a request over these endpoints."""
        block_size = self.block_size_for(endpoints)
        return block_size, self.max_blocks_for(block_size)

    def capacity_for(self, endpoint: Endpoint) -> int:
        """A new server's LRU size: with autoTune its KV cache size in blocks when known."""
        if self.auto_tune and endpoint.metrics.cache_num_blocks > 0:
            return endpoint.metrics.cache_num_blocks
        return self.lru_capacity

    # -- producing -----------------------------------------------------------------------------

    def produce(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> None:
        cycle_state.put(self.produces[0], self.match_infos(cycle_state, request, endpoints))
        cycle_state.put(self.produces[2], self.holdings)

    def match_infos(
        self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]
    ) -> dict[str, PrefixCacheMatchInfo]:
        """A PrefixCacheMatchInfo per endpoint name, also set as the PREFIX_MATCH_KEY attribute; the
        holders' matched blocks go under PREFIX_HOLDERS."""
        if not endpoints:
            return {}
        names = list(map(_name, endpoints))
        counts, total, block_size = self._match(cycle_state, request, endpoints, names)
        cycle_state.put(self.produces[1], counts)
        infos = dict.fromkeys(names, PrefixCacheMatchInfo(0, total, block_size))
        for server, matched in counts.items():
            if server in infos:
                infos[server] = PrefixCacheMatchInfo(matched, total, block_size)
        cycle_state.set_endpoint_attributes(PREFIX_MATCH_KEY, infos)
        if self._metrics is not None:
            self._remember_match(cycle_state, request.request_id, infos, total, block_size)
        return infos

    def _match(
        self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint], names: Iterable[str]
    ) -> tuple[dict[str, int], int, int]:
        """(matched blocks per holder, the prompt's blocks, block size); one index match per request
        even when several plugins or profiles of the cycle read it."""
        self._track_servers(names)
        block_size, max_blocks = self.geometry(endpoints)
        hashes = prefix_block_hashes(request, block_size, max_blocks)
        request.derived.put(self.state_key, (block_size, max_blocks))
        matched = cycle_state.get(self._match_key)
        if matched is not None and matched[0] == block_size and matched[1] == max_blocks:
            counts = matched[2]
        else:
            counts = self.index.match(hashes) if hashes else {}
            cycle_state.put(self._match_key, (block_size, max_blocks, counts))
        return counts, len(hashes), block_size

    # -- learning the decision -----------------------------------------------------------------

    def pre_request(self, request: LLMRequest, result: SchedulingResult) -> None:
        self.learn(request, result)

    def learn(self, request: LLMRequest, result: SchedulingResult) -> None:
        """The primary target, and the prefill target in P/D, now hold the prompt's blocks (once
        per request)."""
        if request.derived.get(self._learned_key):
            return
        request.derived.put(self._learned_key, True)
        state = request.derived.pop(self.state_key)
        targets = learned_targets(result)
        if not targets:
            return
        self._learn_targets(request, state, targets)
        if self._metrics is not None:  # after learning: the index never waits on its metrics
            self._observe_hit(self._metrics, request.request_id, result, targets[0].name)

    def _learn_targets(self, request: LLMRequest, state: tuple[int, int] | None, targets: list[Endpoint]) -> None:
        if state is not None:
            block_size, max_blocks = state
        else:  # not matched here (another process scored it): the same geometry from the targets
            block_size, max_blocks = self.geometry(targets)
        hashes = prefix_block_hashes(request, block_size, max_blocks)
        if not hashes:
            return
        for ep in targets:
            self.index.add(hashes, ep.name, self.capacity_for(ep))
            self.unseen.discard(ep.name)

    # -- forgetting servers --------------------------------------------------------------------

    def forget_servers_not_in(self, names: Iterable[str]) -> list[str]:
        """Drop every indexed server not named (e.g. given the datastore's pod list); returns them."""
        keep = set(names)
        gone = [s for s in self.index.servers() if s not in keep]
        for server in gone:
            self.index.remove_server(server)
            self.unseen.discard(server)
        return gone

    def _track_servers(self, names: Iterable[str]) -> None:
        """Cheap liveness: an indexed server no call listed and no decision named during a whole
        check interval is forgotten (llm-d checks the pod list every 2 minutes). Filters may hide a
        live server from one profile, so one call's candidates are not the pod list."""
        now = self.clock()
        if self.next_check is None:
            self.next_check = now + self.inactive_check_seconds
        elif now >= self.next_check:
            for server in self.unseen:
                self.index.remove_server(server)
            self.unseen = set(self.index.servers())
            self.next_check = now + self.inactive_check_seconds
        if self.unseen:
            self.unseen.difference_update(names)
