"""`gie-prefix-cache-producer`: the approximate prefix producer with GIE's geometry and defaults
(GIE's prefix plugin, whose scorer held the producer's parameters): 16-token blocks without
llm-d's 64-token floor, 256 blocks matched at most, 31250 blocks per server.

The config loader builds one from a `prefix-cache-scorer` in GIE's combined form
(scheduler/config/combined_prefix.py), named `<scorer>/producer`; its prefix-indexer
families keep the labels the combined scorer gave them: the scorer's name and the approximate
producer's type. It can also be declared and named by `prefixMatchInfoProducerName` directly."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, ValidationInfo, field_validator

from scheduler.interfaces import Parameters, PluginHandle
from scheduler.plugins.producers.approx_prefix import ApproxPrefixCacheProducer
from scheduler.plugins.support.prefix import (
    DEFAULT_BLOCK_SIZE_TOKENS,
    DEFAULT_LRU_CAPACITY_PER_SERVER,
    DEFAULT_MAX_PREFIX_BLOCKS,
)
from scheduler.registry import register


class GIEPrefixCacheParameters(Parameters):
    """GIE's parameters. A 0 means "unset" (GIE's Go zero value) and takes the default."""

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
class GIEPrefixCacheProducer(ApproxPrefixCacheProducer):
    type_name = "gie-prefix-cache-producer"
    Parameters = GIEPrefixCacheParameters
    # What the loader moves from a combined scorer to here (by alias and by name), and the name it
    # gives the producer: the scorer's, with this suffix.
    combined_fields: ClassVar[frozenset[str]] = frozenset(
        name for f, info in GIEPrefixCacheParameters.model_fields.items() for name in (f, info.alias) if name
    )
    combined_suffix: ClassVar[str] = "/producer"

    def setup(self, handle: PluginHandle) -> None:
        p: GIEPrefixCacheParameters = self.params
        self.configure(
            auto_tune=p.auto_tune,
            block_size_tokens=p.block_size_tokens or DEFAULT_BLOCK_SIZE_TOKENS,
            max_prefix_blocks=p.max_prefix_blocks_to_match or DEFAULT_MAX_PREFIX_BLOCKS,
            max_prefix_tokens=p.max_prefix_tokens_to_match,
            lru_capacity=p.lru_capacity_per_server or DEFAULT_LRU_CAPACITY_PER_SERVER,
            min_block_size_tokens=0,
            clock=handle.clock,
        )

    def metric_labels(self) -> tuple[str, str]:
        return (self.name.removesuffix(self.combined_suffix), ApproxPrefixCacheProducer.type_name)
