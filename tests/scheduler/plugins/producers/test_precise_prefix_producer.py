"""`precise-prefix-cache-producer` with `prefix-cache-scorer`: llm-d's precise sample schedules a
request to the pod whose KV events say it holds the prompt's blocks; a pod whose events are not
live is scored as the approximate index would; its parameters are llm-d's, and what can not run
here is a load-time error naming it."""

from __future__ import annotations

from pathlib import Path

import pytest

from ray_epp.kvevents import AllBlocksCleared, BlockHasher, BlockRemoved, BlockStored, KVEventBatch
from scheduler import Scheduler
from scheduler.config import load_config, load_config_file
from scheduler.cycle_state import CycleState
from scheduler.errors import ConfigError
from scheduler.interfaces import KVEventSink
from scheduler.plugins.producers.precise_prefix import PrecisePrefixCacheProducer
from scheduler.plugins.support.prefix.precise_index import GAPPED, LIVE
from scheduler.plugins.support.tokenized import set_request_tokens
from tests.scheduler.helpers import endpoint, request

SAMPLE = Path(__file__).parents[3] / "fixtures" / "llm-d" / "sim-epp-no-hit-lru.yaml"
BS = 5  # the sample's tokenProcessorConfig.blockSizeTokens
TOKENS = list(range(1000, 1040))  # 8 blocks


def pods():
    return [endpoint(n, {"llm-d.ai/role": "decode"}) for n in ("decode-a", "decode-b", "decode-c")]


def tokenized(rid: str, tokens=TOKENS):
    req = request(prompt="text the router does not tokenize itself " * 20, request_id=rid)
    set_request_tokens(req, list(tokens))
    return req


def target(sched, req, eps):
    res = sched.schedule(req, eps)
    return res.profile_results[res.primary_profile_name].target_endpoints[0].name


def holds(producer, pod, tokens, blocks):
    n = blocks * BS
    producer.apply_kv_events(
        pod, [KVEventBatch(0.0, [BlockStored([f"{pod}-{i}" for i in range(blocks)], None, tokens[:n], BS)])]
    )


@pytest.fixture
def sched():
    return Scheduler.from_config(load_config_file(SAMPLE))


def producer_of(sched) -> PrecisePrefixCacheProducer:
    sinks = sched.hooks.having(KVEventSink)
    assert len(sinks) == 1 and isinstance(sinks[0], PrecisePrefixCacheProducer)
    return sinks[0]


def test_the_sample_loads_and_the_producer_is_a_kv_event_sink(sched):
    producer = producer_of(sched)
    assert isinstance(producer, KVEventSink)
    assert producer.precise.block_size == BS and producer.kv_event_port() == 5557


def test_a_request_goes_to_the_pod_that_really_holds_its_blocks(sched):
    producer = producer_of(sched)
    eps = pods()
    for ep in eps:
        producer.set_kv_event_status(ep.name, LIVE)
    holds(producer, "decode-c", TOKENS, 6)
    holds(producer, "decode-a", TOKENS, 2)
    assert target(sched, tokenized("r1"), eps) == "decode-c"
    # The pod restarted: its AllBlocksCleared empties its entry; the next longest holder wins.
    producer.apply_kv_events("decode-c", [KVEventBatch(1.0, [AllBlocksCleared()])])
    assert target(sched, tokenized("r2"), eps) == "decode-a"
    assert producer.info()["pods"]["decode-c"] == {"status": LIVE, "blocks": 0}
    scored = producer.info()["scored"]  # per endpoint per read (the prefix and no-hit-LRU scorers read it)
    assert scored["approximate"] == 0 and scored["precise"] > 0 and scored["precise"] % 3 == 0


def test_a_decision_alone_does_not_make_a_live_pod_hold_blocks(sched):
    """Live pods are scored by their events only: where the router sent a prompt before counts
    for nothing until the pod's events say it cached it."""
    producer = producer_of(sched)
    eps = pods()
    for ep in eps:
        producer.set_kv_event_status(ep.name, LIVE)
    first = target(sched, tokenized("r1"), eps)
    holds(producer, "decode-b" if first != "decode-b" else "decode-a", TOKENS, 4)
    assert target(sched, tokenized("r2"), eps) != first


def test_a_gapped_pod_is_scored_as_the_approximate_index_would(sched):
    producer = producer_of(sched)
    eps = pods()
    first = target(sched, tokenized("r1"), eps)  # no pod is live: approximate; it learns `first`
    for ep in eps:
        producer.set_kv_event_status(ep.name, GAPPED if ep.name == first else LIVE)
    # The live pods' events show nothing cached; the gapped one keeps its approximate match.
    assert target(sched, tokenized("r2"), eps) == first
    # One match a request however many plugins read it: r1 3 approximate; r2 2 precise + 1 approximate.
    assert producer.info()["scored"] == {"precise": 2, "approximate": 3 + 1}
    producer.set_kv_event_status(first, LIVE)  # now its (empty) events count: it loses the match
    infos = producer.match_infos(CycleState(), tokenized("r3"), eps)
    assert infos[first].match_blocks == 0


def test_a_pod_that_left_is_forgotten(sched):
    producer = producer_of(sched)
    producer.set_kv_event_status("decode-a", LIVE)
    holds(producer, "decode-a", TOKENS, 3)
    producer.set_kv_event_status("decode-a", "gone")
    assert producer.info()["pods"] == {}
    assert producer.precise.match(producer.precise.keys(TOKENS)) == {}


BASE = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: precise-prefix-cache-producer
  parameters: {params}
- type: prefix-cache-scorer
  parameters:
    prefixMatchInfoProducerName: precise-prefix-cache-producer
"""


@pytest.mark.parametrize(
    ("params", "expect"),
    [
        ("{indexerConfig: {kvBlockIndexConfig: {redisConfig: {address: 'r:6379'}}}}", "external index store"),
        ("{sessionManager: sessions}", "session-cache manager"),
        ("{kvEventsConfig: {engineType: sglang}}", "engineType"),
        ("{tokenProcessorConfig: {blockSize: 0}}", "blockSize"),
        ("{speculativeTTL: soon}", "speculativeTTL"),
        ("{tokenProcessorConfig: {hashAlgo: md5}}", "hashAlgo"),
        ("{tokenProcessorConfig: {blockSize: 16}, indexerConfig: {tokenProcessorConfig: {blockSize: 64}}}", "disagree"),
        ("{indexerConfig: {kvCacheBackendConfigs: [{name: gpu, weight: 1}, {name: GPU, weight: 2}]}}", "twice"),
        ("{indexerConfig: {kvCacheBackendConfigs: [{name: cpu, weight: -1}]}}", "weight"),
        ("{indexerConfig: {kvCacheDefaultBackendWeight: -0.5}}", "kvCacheDefaultBackendWeight"),
        ("{indexerConfig: {kvCacheDefaultBackendWeight: .inf}}", "kvCacheDefaultBackendWeight"),
        ("{indexerConfig: {kvCacheBackendConfigs: [{name: cpu, weight: .nan}]}}", "weight"),
        ("{indexerConfig: {kvCacheBackendConfigs: [{name: '', weight: 1}]}}", "name"),
    ],
)
def test_what_can_not_run_is_a_load_time_error(params, expect):
    with pytest.raises(ConfigError, match=expect):
        load_config(BASE.format(params=params))


SPECULATIVE = BASE.format(
    params="{tokenProcessorConfig: {blockSize: 5}, speculativeIndexing: true, speculativeTTL: 500ms}"
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def spec():
    sched = Scheduler.from_config(load_config(SPECULATIVE))
    producer = producer_of(sched)
    producer.clock = Clock()
    for ep in pods():
        producer.set_kv_event_status(ep.name, LIVE)
    return sched, producer


def test_speculation_sends_a_repeat_where_its_prefix_was_just_sent(spec):
    """With speculativeIndexing the pod a prompt was just sent to counts as holding its blocks
    before its events arrive, so a repeat follows it (without, it goes to the pod whose events show
    a shorter match: test_a_decision_alone_does_not_make_a_live_pod_hold_blocks)."""
    sched, producer = spec
    eps = pods()
    first = target(sched, tokenized("r1"), eps)
    other = "decode-b" if first != "decode-b" else "decode-a"
    holds(producer, other, TOKENS, 4)
    assert target(sched, tokenized("r2"), eps) == first
    assert producer.info()["speculative"] == {"entries": 8, "added": 2, "expired": 0, "requests": 2, "without_keys": 0}
    # Past the TTL the prediction is gone: the pod whose events show blocks wins.
    producer.clock.now += 0.6
    assert target(sched, tokenized("r3"), eps) == other


def test_confirmed_blocks_outlive_the_prediction(spec):
    sched, producer = spec
    eps = pods()
    first = target(sched, tokenized("r1"), eps)
    holds(producer, first, TOKENS, 8)  # the engine cached what was predicted
    producer.clock.now += 10.0
    infos = producer.match_infos(CycleState(), tokenized("r2"), eps)
    assert infos[first].match_blocks == 8
    assert producer.info()["speculative"]["entries"] == 0


def test_speculation_predicts_live_pods_only_and_forgets_a_pod_that_left(spec):
    sched, producer = spec
    eps = pods()
    first = target(sched, tokenized("r1"), eps)
    producer.set_kv_event_status(first, "gone")
    assert producer.info()["speculative"]["entries"] == 0
    producer.set_kv_event_status(first, GAPPED)  # scored approximately: not predicted precisely
    res = sched.schedule(tokenized("r2"), eps)
    chosen = res.profile_results[res.primary_profile_name].target_endpoints[0].name
    assert producer.precise.speculative.match(producer.precise.keys(TOKENS)) == ({} if chosen == first else {chosen: 8})


def test_the_speculative_ttl_is_read_as_llm_d_reads_it():
    ttl = {
        "500ms": 0.5,
        "3s": 3.0,
        "0s": 2.0,  # zero: llm-d's default, 2 s
    }
    for text, seconds in ttl.items():
        cfg = load_config(BASE.format(params=f"{{speculativeIndexing: true, speculativeTTL: {text}}}"))
        assert producer_of(Scheduler.from_config(cfg)).precise.speculative.ttl_s == seconds
    off = producer_of(Scheduler.from_config(load_config(BASE.format(params="{speculativeTTL: 5s}"))))
    assert off.precise.speculative is None and "speculative" not in off.info()


def test_llm_d_parameters_load():
    cfg = load_config(
        BASE.format(
            params="{tokenProcessorConfig: {blockSize: 16, hashSeed: '42'}, kvEventsConfig: {zmqEndpoint: "
            "'tcp://0.0.0.0:5600'}, indexerConfig: {kvBlockIndexConfig: {enableMetrics: false, "
            "metricsLoggingInterval: 60000000000}}}"
        )
    )
    producer = producer_of(Scheduler.from_config(cfg))
    assert producer.precise.block_size == 16 and producer.kv_event_port() == 5600


def test_the_token_processor_may_sit_in_the_indexer_config_as_llm_d_kv_cache_manager_had_it():
    """llm-d-kv-cache-manager's kvcache.Config: {prefixStoreConfig, tokenProcessorConfig,
    kvBlockIndexConfig, tokenizersPoolConfig}; a config written for it names the block size there."""
    nested = "{indexerConfig: {tokenProcessorConfig: {blockSize: 64, hashSeed: '12345'}, kvBlockIndexConfig: {}}}"
    assert producer_of(Scheduler.from_config(load_config(BASE.format(params=nested)))).precise.block_size == 64
    both = "{tokenProcessorConfig: {blockSize: 32}, indexerConfig: {tokenProcessorConfig: {blockSize: 32}}}"
    assert producer_of(Scheduler.from_config(load_config(BASE.format(params=both)))).precise.block_size == 32


@pytest.mark.parametrize(
    ("algo", "engine_seed"),
    [("sha256_cbor", None), ("sha256", None), ("sha256_cbor", "42"), ("xxhash_cbor", None)],
    ids=["vllm-default-unset", "sha256-unset", "PYTHONHASHSEED=42", "xxhash-random"],
)
def test_the_engines_hash_seed_does_not_matter(sched, algo, engine_seed):
    """The index keys blocks from the events' token ids, chained from their parents' keys: an
    engine started without PYTHONHASHSEED (vLLM's "vllm-none-hash", or a random seed for xxhash)
    is matched as well as one with the seed the config names (`hashSeed` is kept, not needed)."""
    producer = producer_of(sched)
    eps = pods()
    for ep in eps:
        producer.set_kv_event_status(ep.name, LIVE)
    hashes = BlockHasher(BS, algo, engine_seed).hashes(TOKENS)
    producer.apply_kv_events("decode-b", [KVEventBatch(0.0, [BlockStored(hashes, None, TOKENS, BS)])])
    assert target(sched, tokenized("r1"), eps) == "decode-b"


def offloads(producer, pod, tokens, blocks):
    """`pod` stored the prompt's first blocks, then moved them to its CPU tier (vLLM's events)."""
    holds(producer, pod, tokens, blocks)
    names = [f"{pod}-{i}" for i in range(blocks)]
    producer.apply_kv_events(
        pod, [KVEventBatch(1.0, [BlockStored(names, None, [], BS, medium="CPU"), BlockRemoved(names)])]
    )


@pytest.mark.parametrize(
    ("gpu_blocks", "weights", "expect"),
    [
        (8, "", "decode-a"),  # the same prefix on the GPU beats it on the CPU (8 against 6.4)
        (5, "", "decode-b"),  # 8 blocks on the CPU (6.4: 6 whole blocks) beat 5 on the GPU
        (7, "", "decode-a"),  # 7 on the GPU beat them
        (7, ", indexerConfig: {kvCacheBackendConfigs: [{name: gpu, weight: 1}, {name: cpu, weight: 1}]}", "decode-b"),
    ],
    ids=["gpu-over-cpu", "longer-cpu", "shorter-gpu", "cpu-weighed-as-gpu"],
)
def test_a_prefix_on_the_cpu_weighs_its_tier(gpu_blocks, weights, expect):
    params = f"{{tokenProcessorConfig: {{blockSize: {BS}}}{weights}}}"
    sched = Scheduler.from_config(load_config(BASE.format(params=params)))
    producer = producer_of(sched)
    eps = pods()
    for ep in eps:
        producer.set_kv_event_status(ep.name, LIVE)
    holds(producer, "decode-a", TOKENS, gpu_blocks)
    offloads(producer, "decode-b", TOKENS, 8)
    assert target(sched, tokenized("r1"), eps) == expect
    assert producer.info()["pods"]["decode-b"] == {"status": LIVE, "blocks": 0, "offloaded": {"cpu": 8}}


def test_the_tier_weights_load_by_llm_ds_names_and_default_as_llm_d():
    default = producer_of(Scheduler.from_config(load_config(BASE.format(params="{}")))).precise.weights
    assert default.weights == {"gpu": 1.0, "cpu": 0.8} and default.default == 1.0
    params = "{indexerConfig: {kvCacheBackendConfigs: [{name: CPU, weight: 0.5}], kvCacheDefaultBackendWeight: 0.25}}"
    weights = producer_of(Scheduler.from_config(load_config(BASE.format(params=params)))).precise.weights
    assert weights.weights == {"cpu": 0.5} and weights.of("gpu") == 0.25  # the list replaces the defaults
