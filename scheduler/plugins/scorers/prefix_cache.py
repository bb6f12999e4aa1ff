"""`prefix-cache-scorer`: endpoints that probably hold more of the prompt's prefix in their KV cache
score higher (GIE's approximate prefix-cache producer and prefix scorer in one plugin).

Score = matched blocks / prompt blocks, where a server's matched blocks come from the longest-prefix
walk over an index of what each server was sent before (scheduler.plugins.support.prefix). Every scored endpoint
gets a PrefixCacheMatchInfo attribute (PREFIX_MATCH_KEY) for other plugins (the P/D decider).

It is also a PreRequest hook: once a request is scheduled, the index learns that the primary
profile's target, and the `prefill` profile's target when there is one, now hold its blocks. Servers
that no scored endpoint list and no decision has named for a whole check interval (2 minutes, as
GIE's pod clean-up) are forgotten; `forget_servers_not_in` does the same at once from a pod list."""

from __future__ import annotations

import time
from collections.abc import Iterable
from operator import attrgetter

from pydantic import Field, ValidationInfo, field_validator

from scheduler.cycle_state import CycleState
from scheduler.interfaces import Parameters, PluginHandle, PreRequest, Scorer, ScorerCategory
from scheduler.plugins.support.prefix import (
    DEFAULT_BLOCK_SIZE_TOKENS,
    DEFAULT_LRU_CAPACITY_PER_SERVER,
    DEFAULT_MAX_PREFIX_BLOCKS,
    PREFIX_MATCH_KEY,
    PrefixCacheMatchInfo,
    PrefixIndex,
    prefix_block_hashes,
)
from scheduler.registry import register
from scheduler.types import Endpoint, LLMRequest, SchedulingResult

# GIE's hard-coded name of the profile whose target also gets the prompt's blocks (P/D prefill),
# used when the result does not name its prefill profile (SchedulingResult.prefill_profile_name).
PREFILL_PROFILE = "prefill"
INACTIVE_SERVER_CHECK_SECONDS = 120.0

_name = attrgetter("name")


class PrefixCacheParameters(Parameters):
    """GIE's prefix-cache parameters. A 0 means "unset" (GIE's Go zero value) and takes the default."""

    auto_tune: bool = Field(default=True, alias="autoTune")
    block_size_tokens: int | None = Field(default=None, alias="blockSizeTokens", ge=0)
    block_size: int = Field(default=0, alias="blockSize", ge=0)  # deprecated: characters
    max_prefix_blocks_to_match: int = Field(default=DEFAULT_MAX_PREFIX_BLOCKS, alias="maxPrefixBlocksToMatch", ge=0)
    max_prefix_tokens_to_match: int = Field(default=0, alias="maxPrefixTokensToMatch", ge=0)
    lru_capacity_per_server: int = Field(default=DEFAULT_LRU_CAPACITY_PER_SERVER, alias="lruCapacityPerServer", ge=0)

    @field_validator("block_size_tokens")
    @classmethod
    def _positive_without_auto_tune(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and value <= 0 and not info.data.get("auto_tune", True):
            raise ValueError(f"blockSizeTokens must be > 0 when autoTune is false (got {value})")
        return value

    @field_validator("block_size")
    @classmethod
    def _deprecated_block_size(cls, value: int, info: ValidationInfo) -> int:
        if value > 0 and not (info.data.get("block_size_tokens") or 0) > 0:
            raise ValueError(
                f"blockSize ({value}) is deprecated; use blockSizeTokens to give the cache block size in tokens"
            )
        return value


@register
class PrefixCacheScorer(Scorer, PreRequest):
    type_name = "prefix-cache-scorer"
    category = ScorerCategory.AFFINITY
    Parameters = PrefixCacheParameters

    def setup(self, handle: PluginHandle) -> None:
        p: PrefixCacheParameters = self.params
        self.auto_tune = p.auto_tune
        self.default_block_size_tokens = p.block_size_tokens or DEFAULT_BLOCK_SIZE_TOKENS
        self.max_prefix_blocks = p.max_prefix_blocks_to_match or DEFAULT_MAX_PREFIX_BLOCKS
        self.max_prefix_tokens = p.max_prefix_tokens_to_match
        self.lru_capacity = p.lru_capacity_per_server or DEFAULT_LRU_CAPACITY_PER_SERVER
        self.index = PrefixIndex(self.lru_capacity)
        self.inactive_check_seconds = INACTIVE_SERVER_CHECK_SECONDS
        self._next_check = time.monotonic() + self.inactive_check_seconds
        self._unseen: set[str] = set()  # indexed servers not yet seen in this check interval
        # Per request, in request.memo: the (block size, max blocks) it was scored with, for pre_request.
        self._state_key = (self.type_name, self.name)
        self._match_key = f"{self.type_name}/{self.name}/match"

    # -- the block geometry -------------------------------------------------------------------

    def block_size_for(self, endpoints: list[Endpoint]) -> int:
        """Tokens per block: with autoTune the first endpoint's cache block size when it reports
        one (as GIE), else blockSizeTokens."""
        if self.auto_tune and endpoints:
            size = endpoints[0].metrics.cache_block_size
            if size > 0:
                return size
        return self.default_block_size_tokens

    def max_blocks_for(self, block_size_tokens: int) -> int:
        """maxPrefixTokensToMatch / block size when set, else maxPrefixBlocksToMatch."""
        if self.max_prefix_tokens > 0:
            return self.max_prefix_tokens // block_size_tokens
        return self.max_prefix_blocks

    def geometry(self, endpoints: list[Endpoint]) -> tuple[int, int]:
        """(block size in tokens, max blocks) for a request scored over these endpoints: what a
        caller that hashes prompts elsewhere (`set_prefix_block_hashes`) must use."""
        block_size = self.block_size_for(endpoints)
        return block_size, self.max_blocks_for(block_size)

    def capacity_for(self, endpoint: Endpoint) -> int:
        """A new server's LRU size: with autoTune its KV cache size in blocks when known."""
        if self.auto_tune and endpoint.metrics.cache_num_blocks > 0:
            return endpoint.metrics.cache_num_blocks
        return self.lru_capacity

    # -- Scorer ------------------------------------------------------------------------------

    def score(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> dict[Endpoint, float]:
        if not endpoints:
            return {}
        names = list(map(_name, endpoints))
        self._track_servers(names)
        block_size, max_blocks = self.geometry(endpoints)
        hashes = prefix_block_hashes(request, block_size, max_blocks)
        request.memo[self._state_key] = (block_size, max_blocks)
        total = len(hashes)
        # One match per request even when this instance scores in several profiles of the cycle.
        memo = cycle_state.read(self._match_key)
        if memo is not None and memo[0] == block_size and memo[1] == max_blocks:
            counts = memo[2]
        else:
            counts = self.index.match(hashes) if total else {}
            cycle_state.write(self._match_key, (block_size, max_blocks, counts))

        # Per endpoint only C-level work (fromkeys, zip); Python work per matched server.
        scores = dict.fromkeys(endpoints, 0.0)
        infos = dict.fromkeys(names, PrefixCacheMatchInfo(0, total, block_size))
        if counts:
            by_name = dict(zip(names, endpoints, strict=True))
            for server, matched in counts.items():
                ep = by_name.get(server)
                if ep is not None:
                    scores[ep] = matched / total
                    infos[server] = PrefixCacheMatchInfo(matched, total, block_size)
        cycle_state.set_endpoint_attributes(PREFIX_MATCH_KEY, infos)
        return scores

    # -- PreRequest ----------------------------------------------------------------------------

    def pre_request(self, request: LLMRequest, result: SchedulingResult) -> None:
        """The primary target, and the prefill target in P/D, now hold the prompt's blocks."""
        state = request.memo.pop(self._state_key, None)
        primary = result.profile_results.get(result.primary_profile_name)
        if primary is None or not primary.target_endpoints:
            return
        targets = [primary.target_endpoints[0]]
        prefill_name = result.prefill_profile_name or PREFILL_PROFILE  # the P/D handler's, else GIE's name
        if result.primary_profile_name != prefill_name:
            prefill = result.profile_results.get(prefill_name)
            if prefill is not None and prefill.target_endpoints:
                targets.append(prefill.target_endpoints[0])
        if state is not None:
            block_size, max_blocks = state
        else:  # not scored here (e.g. another process scored it): the same geometry from the targets
            block_size, max_blocks = self.geometry(targets)
        hashes = prefix_block_hashes(request, block_size, max_blocks)
        if not hashes:
            return
        for ep in targets:
            self.index.add(hashes, ep.name, self.capacity_for(ep))
            self._unseen.discard(ep.name)

    # -- forgetting servers --------------------------------------------------------------------

    def forget_servers_not_in(self, names: Iterable[str]) -> list[str]:
        """Drop every indexed server not named (e.g. given the datastore's pod list); returns them."""
        keep = set(names)
        gone = [s for s in self.index.servers() if s not in keep]
        for server in gone:
            self.index.remove_server(server)
            self._unseen.discard(server)
        return gone

    def _track_servers(self, names: list[str]) -> None:
        """Cheap liveness: an indexed server no score call listed and no decision named during a
        whole check interval is forgotten. Filters may hide a live server from one profile, so one
        call's candidates are not the pod list; per call this costs nothing once every indexed
        server has been seen in the interval."""
        now = time.monotonic()
        if now >= self._next_check:
            for server in self._unseen:
                self.index.remove_server(server)
            self._unseen = set(self.index.servers())
            self._next_check = now + self.inactive_check_seconds
        if self._unseen:
            self._unseen.difference_update(names)
