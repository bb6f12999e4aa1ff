"""`burst-prefix-cache-producer`: co-locate a burst of prompt-sharing requests (e.g. the n samples of
an RL rollout group) so their shared prefix is prefilled once, not on every replica's cold cache
(llm-d's burst prefix producer, pkg/epp/framework/plugins/requestcontrol/dataproducer/burstprefix at
ebab6879).

Every request waits up to `windowDurationMs` while a window fills; the window's requests are then
placed jointly (scheduler.plugins.support.burst_assign) and each gets a PrefixCacheMatchInfo with a
full match on its assigned replica and zero elsewhere, which `prefix-cache-scorer` reads when its
`prefixMatchInfoProducerName` names this plugin. A request outside every unit (no other request of
its window shares its prompt) is scored zero everywhere and left to the other scorers. A full
window (`maxBatchSize`) makes the request's producing fail: it is logged and scheduled without
affinity, as llm-d's Director does with a failed producer.

The window is a DataPreparer: it runs where requests arrive (each gateway replica batches its own
arrivals; `Scheduler.aschedule` in process), and the assignment travels in the cycle state to the
profile, where this plugin, as a Producer, turns it into the match info its scorer reads. Prompts
are hashed from the `token-producer`'s token ids (its PROMPT_TOKENS key in the request's derived
data, which this plugin consumes: the token producer runs just before the window, where the request
arrives, off the event loop) in blocks of
`blockSizeTokens`, as llm-d does; when the tokens can not be had (no token producer, or its server
is unreachable), from the prompt text with the approximate producer's 4-characters-a-token blocks,
which co-locates identical prompts just the same."""

from __future__ import annotations

import asyncio
from typing import Literal

import xxhash
from pydantic import Field, field_validator, model_validator

from scheduler.body_fields import CACHE_SALT_FIELDS, PROMPT_FIELDS
from scheduler.cycle_state import CycleState
from scheduler.data_keys import DataKey
from scheduler.interfaces import DataPreparer, Parameters, PluginHandle, Producer
from scheduler.plugins.support.burst_assign import UNLIMITED, BurstEntry, assign
from scheduler.plugins.support.prefix import (
    PREFIX_HOLDERS,
    PREFIX_MATCH_INFO,
    PREFIX_MATCH_KEY,
    PrefixCacheMatchInfo,
    prefix_block_hashes,
)
from scheduler.plugins.support.prefix.hashing import chain_hashes
from scheduler.plugins.support.prefix.precise_index import TOKEN_BYTES, token_bytes
from scheduler.plugins.support.tokenized import PROMPT_TOKENS, TOKEN_PRODUCER, request_tokens
from scheduler.registry import register
from scheduler.types import Endpoint, LLMRequest

DEFAULT_MAX_PREFIX_BLOCKS = 2048  # llm-d's cap on the blocks that form a group key
MAX_WINDOW_MS = 10000  # every request waits up to the window: a larger one is a config error


class BurstPrefixParameters(Parameters):
    """llm-d's parameters and defaults."""

    window_duration_ms: int = Field(default=100, alias="windowDurationMs", gt=0, le=MAX_WINDOW_MS)
    max_per_replica: int = Field(default=UNLIMITED, alias="maxPerReplica")
    block_size_tokens: int = Field(default=64, alias="blockSizeTokens", gt=0)
    max_prefix_tokens_to_match: int = Field(default=0, alias="maxPrefixTokensToMatch", ge=0)
    min_colocate_blocks: int = Field(default=0, alias="minColocateBlocks", ge=0)
    max_batch_size: int = Field(default=1000, alias="maxBatchSize")
    balance_by: Literal["requests", "tokens", ""] = Field(default="requests", alias="balanceBy")

    @field_validator("max_per_replica", "max_batch_size")
    @classmethod
    def _unlimited_or_positive(cls, value: int) -> int:
        if value != UNLIMITED and value < 1:
            raise ValueError(f"must be -1 (unlimited) or >= 1 (got {value})")
        return value

    @model_validator(mode="after")
    def _check(self) -> BurstPrefixParameters:
        if 0 < self.max_prefix_tokens_to_match < self.block_size_tokens:
            raise ValueError(
                f"maxPrefixTokensToMatch ({self.max_prefix_tokens_to_match}) must be 0 or >= blockSizeTokens "
                f"({self.block_size_tokens}); a smaller positive value yields zero prefix blocks"
            )
        return self


class _Window:
    """The requests of one batch window, released together when it seals."""

    __slots__ = ("entries", "sealed")

    def __init__(self) -> None:
        self.entries: list[BurstEntry] = []
        self.sealed = asyncio.Event()


@register
class BurstPrefixCacheProducer(DataPreparer, Producer):
    type_name = "burst-prefix-cache-producer"
    body_fields = PROMPT_FIELDS | CACHE_SALT_FIELDS  # the prompt's block hashes
    Parameters = BurstPrefixParameters

    def setup(self, handle: PluginHandle) -> None:
        p: BurstPrefixParameters = self.params
        self.window_s = p.window_duration_ms / 1000.0
        self.k = p.max_per_replica
        self.block_size_tokens = p.block_size_tokens
        tokens_cap = p.max_prefix_tokens_to_match
        self.max_blocks = tokens_cap // p.block_size_tokens if tokens_cap else DEFAULT_MAX_PREFIX_BLOCKS
        self.min_colocate_blocks = p.min_colocate_blocks
        self.max_batch_size = p.max_batch_size
        self.by_tokens = p.balance_by == "tokens"
        # llm-d's producer consumes the token producer's tokens, read by its type name.
        if TOKEN_PRODUCER in handle.plugin_names():
            self.consumes = (PROMPT_TOKENS,)
        self._window: _Window | None = None
        self._key: DataKey[tuple[str | None, int]] = DataKey(f"{self.type_name}/assigned", self.name)
        self.produces = (PREFIX_MATCH_INFO.of(self.name), PREFIX_HOLDERS.of(self.name))
        self.sealed_windows = 0
        self.full_rejections = 0

    # -- hashing -------------------------------------------------------------------------------

    def block_hashes(self, request: LLMRequest) -> list[int]:
        """The prompt's chained block hashes: of its token ids when the token producer made them,
        else of the text."""
        tokens = request_tokens(request) if self.consumes else None
        if tokens is None:
            return prefix_block_hashes(request, self.block_size_tokens, self.max_blocks)
        data = token_bytes(tokens[: self.block_size_tokens * self.max_blocks])
        return chain_hashes(data, _seed(request), self.block_size_tokens * TOKEN_BYTES)

    # -- the window ----------------------------------------------------------------------------

    async def prepare(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> None:
        entry = BurstEntry(self.block_hashes(request), endpoints)
        window = self._window
        if window is None:
            window = self._window = _Window()
            asyncio.get_running_loop().call_later(self.window_s, self._seal, window)
        if self.max_batch_size != UNLIMITED and len(window.entries) >= self.max_batch_size:
            self.full_rejections += 1
            raise RuntimeError(f"burst prefix batch full: maxBatchSize {self.max_batch_size} reached")
        window.entries.append(entry)
        await window.sealed.wait()  # a client that leaves cancels this wait; its entry stays placed
        cycle_state.put(self._key, (entry.assigned, len(entry.hashes)))

    def _seal(self, window: _Window) -> None:
        if self._window is window:
            self._window = None
        assign(window.entries, self.k, self.min_colocate_blocks, self.by_tokens)
        self.sealed_windows += 1
        window.sealed.set()

    # -- what the prefix-cache scorer reads ------------------------------------------------------

    def produce(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> None:
        """A full match on the assigned replica, zero elsewhere (also the PREFIX_MATCH_KEY attribute).
        An endpoint set that changed since the window (the replica is gone) gives zero everywhere.
        Nothing to learn afterwards: a window's assignment is all its state (cross-window reuse is
        the approximate or precise producer's, which can run beside this one)."""
        assigned, total = cycle_state.get(self._key) or (None, 0)
        size = self.block_size_tokens
        infos = {ep.name: PrefixCacheMatchInfo(total if ep.name == assigned else 0, total, size) for ep in endpoints}
        cycle_state.set_endpoint_attributes(PREFIX_MATCH_KEY, infos)
        cycle_state.put(self.produces[0], infos)
        cycle_state.put(self.produces[1], {assigned: total} if assigned is not None and total else {})

    def geometry(self, endpoints: list[Endpoint]) -> tuple[int, int]:
        return self.block_size_tokens, self.max_blocks


def _seed(request: LLMRequest) -> int:
    """The chain's start: the model name and cache salt, as the text path and llm-d seed it."""
    return xxhash.xxh64_intdigest((request.target_model + request.cache_salt()).encode())
