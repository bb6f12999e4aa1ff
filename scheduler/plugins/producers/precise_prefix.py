"""`precise-prefix-cache-producer`: how much of a request's prompt each endpoint really holds in its
KV cache, from the endpoints' own KV-cache events (llm-d's precise prefix producer,
pkg/epp/framework/plugins/requestcontrol/dataproducer/preciseprefixcache, with llm-d-kv-cache's index).

Per request: the prompt's tokens from the `token-producer` (its PROMPT_TOKENS key, which this
producer consumes, so the token producer runs first) → block keys → the precise index's
longest cached prefix per pod (scheduler.plugins.support.prefix.precise_index) → a
PrefixCacheMatchInfo per endpoint, read by `prefix-cache-scorer` through
`prefixMatchInfoProducerName`, as the approximate producer's is.

**The fallback rule.** An endpoint whose event stream is not `live` (never heard from, `gapped`:
messages lost and not replayed, `silent`: nothing for too long) is scored as the approximate index
would score it: this producer is an approximate producer too (llm-d's defaults, learning from
decisions), and the precise figure replaces the approximate one only for live endpoints. A request
without tokens (no token producer and none in its derived data, or the tokenizer failed) is scored
approximately throughout.

It is a KVEventSink: the runtime subscribes to each pod's events (port `kvEventsConfig.
podDiscoveryConfig.socketPort`, 5557, unless the pod's spec names its own) and feeds them here."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from scheduler.cycle_state import CycleState
from scheduler.data_keys import DataKey
from scheduler.duration import parse_duration
from scheduler.interfaces import KVEventSink, Parameters, PluginHandle
from scheduler.plugins.producers.approx_prefix import (
    MIN_BLOCK_SIZE_TOKENS,
    ApproxPrefixCacheParameters,
    ApproxPrefixCacheProducer,
    learned_targets,
)
from scheduler.plugins.support.prefix import PREFIX_MATCH_KEY, PrefixCacheMatchInfo
from scheduler.plugins.support.prefix.precise_index import LIVE, PreciseIndex
from scheduler.plugins.support.prefix.speculative_entries import SpeculativeEntries
from scheduler.plugins.support.prefix.tier_weights import (
    DEFAULT_BACKEND_WEIGHT,
    DEFAULT_TIER_WEIGHTS,
    TierWeights,
    tier_of,
)
from scheduler.plugins.support.tokenized import PROMPT_TOKENS, TOKEN_PRODUCER, request_token_run, request_tokens
from scheduler.registry import register
from scheduler.types import Endpoint, LLMRequest, SchedulingResult

DEFAULT_EVENT_PORT = 5557  # vLLM's and llm-d's default KV-events port
DEFAULT_SPECULATIVE_TTL_S = 2.0  # llm-d's defaultSpeculativeTTL
PENDING_KEYS = 4096  # requests scored and not yet decided whose keys are kept for speculation


class TokenProcessorConfig(Parameters):
    """llm-d-kv-cache's TokenProcessorConfig: the block size keys are cut at (must be the engine's
    `--block-size`), and the hash seed (kept for llm-d's configs; keys here are recomputed from
    token ids, so it need not match the engine's PYTHONHASHSEED)."""

    block_size: int = Field(default=16, alias="blockSize", gt=0)
    block_size_tokens: int = Field(default=0, alias="blockSizeTokens", ge=0)
    hash_seed: str = Field(default="", alias="hashSeed")

    @property
    def tokens_per_block(self) -> int:
        return self.block_size_tokens or self.block_size


class InMemoryIndexConfig(Parameters):
    size: int = Field(default=100_000_000, gt=0)  # keys across every pod (llm-d-kv-cache's default)
    pod_cache_size: int = Field(default=10, alias="podCacheSize", gt=0)


class KVBlockIndexConfig(Parameters):
    enable_metrics: bool = Field(default=False, alias="enableMetrics")
    metrics_logging_interval: int | str = Field(default=0, alias="metricsLoggingInterval")
    in_memory_config: InMemoryIndexConfig | None = Field(default=None, alias="inMemoryConfig")
    redis_config: dict[str, Any] | None = Field(default=None, alias="redisConfig")
    valkey_config: dict[str, Any] | None = Field(default=None, alias="valkeyConfig")
    cost_aware_memory_config: dict[str, Any] | None = Field(default=None, alias="costAwareMemoryConfig")

    @field_validator("redis_config", "valkey_config", "cost_aware_memory_config")
    @classmethod
    def _in_memory_only(cls, value: dict[str, Any] | None) -> None:
        if value is not None:
            raise ValueError(
                "Ray EPP keeps the index in its profile actors' memory (every gateway replica shares them); "
                "an external index store is not run here"
            )
        return None


class KVCacheBackendConfig(Parameters):
    """One device tier's weight (llm-d's KVCacheBackendConfig): `name` is the events' medium in
    lower case ("gpu", "cpu", ...)."""

    name: str = Field(min_length=1)
    weight: float = Field(ge=0, allow_inf_nan=False)


class IndexerConfig(Parameters):
    """llm-d-kv-cache's kvcache.Config. Its earlier shape (llm-d-kv-cache-manager) carried the
    token processor here (`indexerConfig.tokenProcessorConfig`); such a config still loads, and
    that block is the token processor's unless the plugin's own `tokenProcessorConfig` is given.
    `kvCacheBackendConfigs` (replacing the defaults when given, as in llm-d) and
    `kvCacheDefaultBackendWeight` weigh a match by the tier its blocks are in (tier_weights)."""

    kv_block_index_config: KVBlockIndexConfig = Field(default_factory=KVBlockIndexConfig, alias="kvBlockIndexConfig")
    token_processor_config: TokenProcessorConfig | None = Field(default=None, alias="tokenProcessorConfig")
    kv_cache_backend_configs: list[KVCacheBackendConfig] = Field(
        default_factory=lambda: [KVCacheBackendConfig(name=n, weight=w) for n, w in DEFAULT_TIER_WEIGHTS.items()],
        alias="kvCacheBackendConfigs",
    )
    kv_cache_default_backend_weight: float = Field(
        default=DEFAULT_BACKEND_WEIGHT, alias="kvCacheDefaultBackendWeight", ge=0, allow_inf_nan=False
    )

    @field_validator("kv_cache_backend_configs")
    @classmethod
    def _one_weight_per_tier(cls, value: list[KVCacheBackendConfig]) -> list[KVCacheBackendConfig]:
        names = [tier_of(c.name) for c in value]
        if len(set(names)) != len(names):
            raise ValueError(f"kvCacheBackendConfigs names a tier twice (names are read in lower case): {names}")
        return value

    def tier_weights(self) -> TierWeights:
        weights = {c.name: c.weight for c in self.kv_cache_backend_configs}
        return TierWeights(weights, self.kv_cache_default_backend_weight)


class PodDiscoveryConfig(Parameters):
    socket_port: int = Field(default=DEFAULT_EVENT_PORT, alias="socketPort", gt=0, lt=65536)
    pod_label_selector: str = Field(default="", alias="podLabelSelector")
    pod_namespace: str = Field(default="", alias="podNamespace")


class KVEventsConfig(Parameters):
    """llm-d-kv-cache's kvevents.Config. Ray EPP always subscribes to each pod (llm-d's
    `discoverPods` mode, pods from its own pod sources); `zmqEndpoint` (one socket every pod
    connects to) is accepted and its port is the per-pod port."""

    zmq_endpoint: str = Field(default="", alias="zmqEndpoint")
    topic_filter: str = Field(default="kv@", alias="topicFilter")
    concurrency: int = Field(default=4, gt=0)
    discover_pods: bool = Field(default=True, alias="discoverPods")
    pod_discovery_config: PodDiscoveryConfig = Field(default_factory=PodDiscoveryConfig, alias="podDiscoveryConfig")
    engine_type: Literal["vllm"] = Field(default="vllm", alias="engineType")
    tracing: bool = False

    @property
    def port(self) -> int:
        if "pod_discovery_config" not in self.model_fields_set and self.zmq_endpoint.rpartition(":")[2].isdigit():
            return int(self.zmq_endpoint.rpartition(":")[2])
        return self.pod_discovery_config.socket_port


class PrecisePrefixCacheParameters(Parameters):
    token_processor_config: TokenProcessorConfig = Field(
        default_factory=TokenProcessorConfig, alias="tokenProcessorConfig"
    )
    indexer_config: IndexerConfig = Field(default_factory=IndexerConfig, alias="indexerConfig")
    kv_events_config: KVEventsConfig = Field(default_factory=KVEventsConfig, alias="kvEventsConfig")
    speculative_indexing: bool = Field(default=False, alias="speculativeIndexing")
    speculative_ttl: str = Field(default="2s", alias="speculativeTTL")
    session_manager: str = Field(default="", alias="sessionManager")

    @model_validator(mode="after")
    def _one_token_processor(self) -> PrecisePrefixCacheParameters:
        nested = self.indexer_config.token_processor_config
        if nested is None or "token_processor_config" not in self.model_fields_set:
            return self
        if nested.tokens_per_block != self.token_processor_config.tokens_per_block:
            raise ValueError(
                f"tokenProcessorConfig (block size {self.token_processor_config.tokens_per_block}) and "
                f"indexerConfig.tokenProcessorConfig (block size {nested.tokens_per_block}) disagree: give one"
            )
        return self

    @property
    def token_processor(self) -> TokenProcessorConfig:
        """The plugin's own tokenProcessorConfig, else the indexer config's, else the default."""
        nested = self.indexer_config.token_processor_config
        if nested is not None and "token_processor_config" not in self.model_fields_set:
            return nested
        return self.token_processor_config

    @field_validator("speculative_ttl")
    @classmethod
    def _duration(cls, value: str) -> str:
        parse_duration(value)
        return value

    @property
    def speculative_ttl_s(self) -> float:
        """The TTL in seconds; zero or less means llm-d's default (2 s), as llm-d reads it."""
        ttl = parse_duration(self.speculative_ttl)
        return ttl if ttl > 0 else DEFAULT_SPECULATIVE_TTL_S

    @field_validator("session_manager")
    @classmethod
    def _no_session_manager(cls, value: str) -> str:
        if value:
            raise ValueError("no session-cache manager plugin exists in Ray EPP (nor in llm-d's repository)")
        return value


@register
class PrecisePrefixCacheProducer(ApproxPrefixCacheProducer, KVEventSink):
    type_name = "precise-prefix-cache-producer"
    Parameters = PrecisePrefixCacheParameters
    exports_indexer_metrics = False  # llm-d's prefix_indexer families are the approximate producer's

    def setup(self, handle: PluginHandle) -> None:
        p: PrecisePrefixCacheParameters = self.params
        fallback = ApproxPrefixCacheParameters()
        self.configure(
            auto_tune=fallback.auto_tune,
            block_size_tokens=fallback.block_size_tokens,
            max_prefix_blocks=fallback.max_prefix_blocks_to_match,
            max_prefix_tokens=fallback.max_prefix_tokens_to_match,
            lru_capacity=fallback.lru_capacity_per_server,
            min_block_size_tokens=MIN_BLOCK_SIZE_TOKENS,
            clock=handle.clock,
        )
        self.precise = PreciseIndex(p.token_processor.tokens_per_block, weights=p.indexer_config.tier_weights())
        self.max_precise_blocks = fallback.max_prefix_tokens_to_match // self.precise.block_size
        self.port = p.kv_events_config.port
        # Per endpoint scored: by the precise index, or by the approximate one (the fallback rule).
        self.scored = {"precise": 0, "approximate": 0}
        # llm-d's producers read the token producer by its type name; without one, the tokens a
        # request already carries (the cluster simulation's).
        if TOKEN_PRODUCER in handle.plugin_names():
            self.consumes = (PROMPT_TOKENS,)
        # Speculative indexing: the keys of requests scored here, until their decision is learned.
        self._pending_keys: OrderedDict[str, list[int]] = OrderedDict()
        self._speculated_key: DataKey[bool] = DataKey(f"{self.type_name}/speculated", self.name)  # once per request
        self.speculated = {"requests": 0, "without_keys": 0}
        if p.speculative_indexing:
            self.precise.speculative = SpeculativeEntries(p.speculative_ttl_s)

    # -- KVEventSink ---------------------------------------------------------------------------

    def apply_kv_events(self, pod: str, batches: list[Any]) -> None:
        self.precise.apply_batches(pod, batches)

    def set_kv_event_status(self, pod: str, status: str) -> None:
        if status == "gone":
            self.precise.remove_pod(pod)
        else:
            self.precise.set_status(pod, status)

    def kv_event_port(self) -> int:
        return self.port

    # -- producing -----------------------------------------------------------------------------

    def match_infos(
        self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]
    ) -> dict[str, PrefixCacheMatchInfo]:
        """The approximate infos, with the precise figure for every endpoint whose events are live."""
        infos = super().match_infos(cycle_state, request, endpoints)
        index = self.precise
        live = [ep for ep in endpoints if index.status(ep.name) == LIVE]
        scored = self.scored
        scored["approximate"] += len(endpoints)
        for ep in live:  # a pod's entry is sized by its KV cache when it reports one
            if ep.metrics.cache_num_blocks > 0 and not index.pod_blocks(ep.name):
                index.set_capacity(ep.name, ep.metrics.cache_num_blocks)
        if not live:
            return infos
        tokens = request_tokens(request)
        if tokens is None:
            return infos
        if index.speculative is None:
            counts, total = index.lookup(tokens, self.max_precise_blocks, request_token_run(request))
        else:  # every prompt's keys are needed: a cold one is predicted where it is sent
            index.speculative.expire(self.clock())
            keys = index.keys(tokens, self.max_precise_blocks, request_token_run(request))
            counts, total = index.match(keys), len(keys)
            self._keep_keys(request.request_id, keys)
        size = index.block_size
        for ep in live:
            infos[ep.name] = PrefixCacheMatchInfo(counts.get(ep.name, 0), total, size)
        scored["precise"] += len(live)
        scored["approximate"] -= len(live)
        cycle_state.set_endpoint_attributes(PREFIX_MATCH_KEY, infos)
        return infos

    # -- speculative indexing ------------------------------------------------------------------

    def learn(self, request: LLMRequest, result: SchedulingResult) -> None:
        """The approximate index learns the decision; with speculative indexing, each live target
        is also predicted to hold the prompt's precise blocks for `speculativeTTL`."""
        super().learn(request, result)
        speculative = self.precise.speculative
        if speculative is None or request.derived.get(self._speculated_key):
            return
        request.derived.put(self._speculated_key, True)
        keys = self._pending_keys.pop(request.request_id, None)
        if keys is None:  # not scored here (another process did) or no live pod then: from its tokens
            tokens = request_tokens(request)
            if tokens is None:
                self.speculated["without_keys"] += 1
                return
            keys = self.precise.keys(tokens, self.max_precise_blocks, request_token_run(request))
        now = self.clock()
        for ep in learned_targets(result):
            if self.precise.status(ep.name) == LIVE:
                speculative.add(ep.name, keys, now)
        self.speculated["requests"] += 1

    def _keep_keys(self, request_id: str, keys: list[int]) -> None:
        pending = self._pending_keys
        pending[request_id] = keys
        pending.move_to_end(request_id)
        while len(pending) > PENDING_KEYS:  # decided elsewhere or never: the oldest go
            pending.popitem(last=False)

    def info(self) -> dict[str, Any]:
        """The precise index's pods, their event status and block counts, the event counters, and
        how many endpoint scorings used the precise index or fell back to the approximate one."""
        index = self.precise
        pods = {pod: {"status": st, "blocks": index.pod_blocks(pod)} for pod, st in index.statuses().items()}
        for pod, entry in pods.items():
            if offloaded := index.offloaded_blocks(pod):  # blocks in other tiers (a CPU offload), when any
                entry["offloaded"] = offloaded
        counts = index.counts
        out: dict[str, Any] = {
            "pods": pods,
            "events": {f: getattr(counts, f) for f in counts.__slots__},  # type: ignore[attr-defined]
            "scored": dict(self.scored),
        }
        speculative = index.speculative
        if speculative is not None:
            out["speculative"] = {
                "entries": len(speculative),
                "added": speculative.added,
                "expired": speculative.expired,
                **self.speculated,
            }
        return out
