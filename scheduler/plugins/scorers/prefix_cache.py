"""`prefix-cache-scorer`: endpoints that probably hold more of the prompt's prefix in their KV cache
score higher.

Two forms load. llm-d's: the scorer reads the PrefixCacheMatchInfo of an `approx-prefix-cache-producer`
(or the precise or burst producer; named by `prefixMatchInfoProducerName`, else the plugin named
`approx-prefix-cache-producer` when the config has one); the producer's parameters live on the
producer. GIE's older combined form: no such producer, the scorer takes the producer's parameters
itself and owns a private producer with GIE's geometry (below).

Score = matched blocks / prompt blocks, where a server's matched blocks come from the longest-prefix
walk over an index of what each server was sent before (scheduler.plugins.support.prefix). Every scored endpoint
gets a PrefixCacheMatchInfo attribute (PREFIX_MATCH_KEY) for other plugins (the P/D decider).

It is also a PreRequest hook: once a request is scheduled, the index learns that the primary
profile's target, and the `prefill` profile's target when there is one, now hold its blocks. Servers
that no scored endpoint list and no decision has named for a whole check interval (2 minutes, as
GIE's pod clean-up) are forgotten; `forget_servers_not_in` does the same at once from a pod list."""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import Field, ValidationInfo, field_validator

from scheduler.body_fields import CACHE_SALT_FIELDS, PROMPT_FIELDS
from scheduler.cycle_state import CycleState
from scheduler.interfaces import Parameters, PluginHandle, PluginMetrics, PreRequest, Scorer, ScorerCategory
from scheduler.plugins.producers.approx_prefix import (
    INACTIVE_SERVER_CHECK_SECONDS,
    PREFILL_PROFILE,
    ApproxPrefixCacheProducer,
)
from scheduler.plugins.producers.burst_prefix import BurstPrefixCacheProducer
from scheduler.plugins.support.prefix import (
    DEFAULT_BLOCK_SIZE_TOKENS,
    DEFAULT_LRU_CAPACITY_PER_SERVER,
    DEFAULT_MAX_PREFIX_BLOCKS,
    PrefixIndex,
)
from scheduler.registry import register
from scheduler.types import Endpoint, LLMRequest, SchedulingResult

__all__ = ["INACTIVE_SERVER_CHECK_SECONDS", "PREFILL_PROFILE", "PrefixCacheParameters", "PrefixCacheScorer"]

# The combined form's own parameters: set together with a producer they would be ignored.
COMBINED_FIELDS = frozenset(
    {"auto_tune", "block_size_tokens", "block_size", "max_prefix_blocks_to_match", "max_prefix_tokens_to_match",
     "lru_capacity_per_server"}
)  # fmt: skip


class PrefixCacheParameters(Parameters):
    """llm-d's scorer parameters (the producer's name, the match-length blend) and GIE's combined-form
    producer parameters. A 0 means "unset" (GIE's Go zero value) and takes the default."""

    prefix_match_info_producer_name: str = Field(default="", alias="prefixMatchInfoProducerName")
    match_length_weight: float = Field(default=0.0, alias="matchLengthWeight", ge=0.0, le=1.0)
    match_length_scale_tokens: int = Field(default=8192, alias="matchLengthScaleTokens")

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
    body_fields = PROMPT_FIELDS | CACHE_SALT_FIELDS  # its own producer's, in GIE's combined form
    category = ScorerCategory.AFFINITY
    Parameters = PrefixCacheParameters

    def setup(self, handle: PluginHandle) -> None:
        p: PrefixCacheParameters = self.params
        if p.match_length_weight > 0 and p.match_length_scale_tokens <= 0:
            raise ValueError("matchLengthScaleTokens must be > 0 when matchLengthWeight is > 0")
        self.match_length_weight = p.match_length_weight
        self.match_length_scale_tokens = p.match_length_scale_tokens
        combined = sorted(COMBINED_FIELDS & p.model_fields_set)
        producer_name = p.prefix_match_info_producer_name
        if not producer_name and not combined and ApproxPrefixCacheProducer.type_name in handle.plugin_names():
            producer_name = ApproxPrefixCacheProducer.type_name  # llm-d's default producer name
        if producer_name:
            if combined:
                fields = ", ".join(PrefixCacheParameters.model_fields[f].alias or f for f in combined)
                raise ValueError(
                    f"{fields}: set these on the producer {producer_name!r}, not on a scorer that reads it"
                )
            named = handle.plugin(producer_name) if producer_name in handle.plugin_names() else None
            if isinstance(named, BurstPrefixCacheProducer):
                self.producer = named  # its window's assignment: a full match on one replica
                return
            self.producer = handle.plugin_of_type(
                producer_name, ApproxPrefixCacheProducer, "prefixMatchInfoProducerName"
            )
            return
        # GIE's combined form: a private producer with GIE's geometry.
        self.producer = ApproxPrefixCacheProducer.__new__(ApproxPrefixCacheProducer)
        self.producer.name = self.name
        self.producer.params = p
        self.producer.configure(
            auto_tune=p.auto_tune,
            block_size_tokens=p.block_size_tokens or DEFAULT_BLOCK_SIZE_TOKENS,
            max_prefix_blocks=p.max_prefix_blocks_to_match or DEFAULT_MAX_PREFIX_BLOCKS,
            max_prefix_tokens=p.max_prefix_tokens_to_match,
            lru_capacity=p.lru_capacity_per_server or DEFAULT_LRU_CAPACITY_PER_SERVER,
            min_block_size_tokens=0,
        )

    # -- the producer's state, as the combined form has always shown it -------------------------

    _FORWARDED = frozenset(
        {"auto_tune", "default_block_size_tokens", "max_prefix_blocks", "max_prefix_tokens", "lru_capacity",
         "inactive_check_seconds", "block_size_for", "max_blocks_for", "capacity_for"}
    )  # fmt: skip

    def __getattr__(self, name: str) -> object:
        if name in PrefixCacheScorer._FORWARDED:
            return getattr(self.producer, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def index(self) -> PrefixIndex:
        return self.producer.index

    @property
    def _state_key(self) -> tuple[str, str]:
        return self.producer.state_key

    @property
    def _next_check(self) -> float:
        return self.producer.next_check

    @_next_check.setter
    def _next_check(self, value: float) -> None:
        self.producer.next_check = value

    def geometry(self, endpoints: list[Endpoint]) -> tuple[int, int]:
        """(block size in tokens, max blocks) for a request scored over these endpoints: what a
        caller that hashes prompts elsewhere (`set_prefix_block_hashes`) must use."""
        return self.producer.geometry(endpoints)

    def forget_servers_not_in(self, names: Iterable[str]) -> list[str]:
        return self.producer.forget_servers_not_in(names)

    def bind_metrics(self, metrics: PluginMetrics) -> None:
        """The producer's prefix-indexer families (a private producer is no plugin of its own)."""
        bind = getattr(self.producer, "bind_metrics", None)
        if bind is not None:
            bind(metrics)

    # -- Scorer ------------------------------------------------------------------------------

    def score(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> dict[Endpoint, float]:
        """matched / total blocks; with matchLengthWeight w, blended as llm-d does with
        min(1, matched tokens / matchLengthScaleTokens)^2."""
        infos = self.producer.produce(cycle_state, request, endpoints)
        scores = dict.fromkeys(endpoints, 0.0)
        w = self.match_length_weight
        for ep in endpoints:
            info = infos.get(ep.name)
            if info is None or not info.match_blocks or not info.total_blocks:
                continue
            ratio = info.match_blocks / info.total_blocks
            if w > 0.0:
                length = min(1.0, info.match_tokens / self.match_length_scale_tokens)
                ratio = w * length * length + (1.0 - w) * ratio
            scores[ep] = ratio
        return scores

    # -- PreRequest ----------------------------------------------------------------------------

    def pre_request(self, request: LLMRequest, result: SchedulingResult) -> None:
        """The producer learns the decision (once per request, however many scorers read it)."""
        self.producer.learn(request, result)
