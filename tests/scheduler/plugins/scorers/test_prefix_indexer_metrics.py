"""The prefix indexer's families (llm-d's prefix_indexer size, hit ratio, hit bytes), recorded by a
bound approx-prefix-cache-producer into a real MetricsRecorder: the match on the chosen endpoint,
once per request, by the instance whose match covered it; nothing when unbound."""

from __future__ import annotations

from actors.metrics_hub import MetricsRecorder
from scheduler import CycleState, ProfileRunResult, SchedulingResult, load_config
from scheduler.config import build_plugins
from scheduler.cycle_state import RUNNING_PROFILE
from scheduler.interfaces import bind_plugin_metrics
from scheduler.lifecycle import Lifecycle
from scheduler.plugins.producers.approx_prefix import (
    CHARS_PER_TOKEN,
    HIT_BYTES,
    HIT_RATIO,
    INDEX_SIZE,
    MATCHES_KEPT,
    ApproxPrefixCacheParameters,
    ApproxPrefixCacheProducer,
)
from scheduler.plugins.support.prefix import prefix_block_hashes
from tests.scheduler.helpers import endpoint, request

PROMPT = "The same long document, read again and again by every request of the test. " * 12
LABELS = ("approx-prefix-cache-producer", "approx-prefix-cache-producer")


def producer() -> ApproxPrefixCacheProducer:
    return ApproxPrefixCacheProducer(params=ApproxPrefixCacheParameters.model_validate({"autoTune": False}))


def decided(target, profile: str = "default") -> SchedulingResult:
    return SchedulingResult({profile: ProfileRunResult([target])}, profile)


def observed(rec: MetricsRecorder, name: str, labels=LABELS) -> tuple[float, float]:
    """(count, sum) of a histogram's samples."""
    counts = rec.state()["histograms"].get((name, labels))
    return (0.0, 0.0) if counts is None else (sum(counts[:-1]), counts[-1])


def schedule(p: ApproxPrefixCacheProducer, request_id: str, target, endpoints) -> None:
    req = request(prompt=PROMPT, request_id=request_id)
    p.produce(CycleState(), req, endpoints)
    p.learn(req, decided(target))


def test_an_unbound_producer_keeps_nothing_for_metrics():
    p = producer()
    eps = [endpoint("a"), endpoint("b")]
    schedule(p, "r1", eps[0], eps)
    assert not p._matches  # the in-process Scheduler: no bookkeeping per request


def test_a_bound_producer_records_the_chosen_endpoints_match_and_its_size():
    p, rec = producer(), MetricsRecorder()
    p.bind_metrics(rec)
    p.bind_metrics(rec)  # bound twice (a scorer forwards too): one collector
    eps = [endpoint("a"), endpoint("b")]
    schedule(p, "r1", eps[0], eps)  # a cold index: no match
    schedule(p, "r2", eps[0], eps)  # the same prompt, the same endpoint: all of it
    schedule(p, "r3", eps[1], eps)  # the other endpoint: none of it
    count, ratio_sum = observed(rec, HIT_RATIO)
    assert (count, ratio_sum) == (3, 1.0)
    block_size, max_blocks = p.geometry(eps)
    blocks = len(prefix_block_hashes(request(prompt=PROMPT), block_size, max_blocks))
    count, hit_bytes = observed(rec, HIT_BYTES)
    assert blocks > 1 and count == 3 and hit_bytes == blocks * block_size * CHARS_PER_TOKEN
    assert rec.state()["gauges"] == {(INDEX_SIZE, LABELS): float(p.index.entries())}
    assert p.index.entries() == 2 * len(p.index)  # both endpoints hold every block
    assert not p._matches


def test_only_the_instance_that_matched_the_chosen_endpoint_records():
    """P/D: the prefill actor's match covered prefill pods only; the decode target is not among them."""
    decode, prefill = producer(), producer()
    rec = MetricsRecorder()
    decode.bind_metrics(rec)
    prefill.bind_metrics(rec)
    d, pf = endpoint("decode-0"), endpoint("prefill-0")
    req = request(prompt=PROMPT, request_id="pd")
    decode.produce(CycleState(), req, [d])
    prefill.produce(CycleState(), request(prompt=PROMPT, request_id="pd"), [pf])
    result = SchedulingResult({"decode": ProfileRunResult([d]), "prefill": ProfileRunResult([pf])}, "decode", "prefill")
    decode.learn(req, result)
    prefill.learn(request(prompt=PROMPT, request_id="pd"), result)
    assert observed(rec, HIT_BYTES)[0] == 1


def test_in_profiles_only_the_primary_profiles_instance_records():
    """P/D in the Ray path: each profile actor's producer matches the whole pool before its filters;
    the decode actor's, whose profile is the primary, records the hit; the prefill actor's does not."""
    decode, prefill = producer(), producer()
    rec = MetricsRecorder()
    decode.bind_metrics(rec)
    prefill.bind_metrics(rec)
    d, pf = endpoint("decode-0"), endpoint("prefill-0")
    for instance, profile in ((decode, "decode"), (prefill, "prefill")):
        state = CycleState()
        state.put(RUNNING_PROFILE, profile)
        instance.produce(state, request(prompt=PROMPT, request_id="pd"), [d, pf])
    result = SchedulingResult({"decode": ProfileRunResult([d]), "prefill": ProfileRunResult([pf])}, "decode", "prefill")
    decode.learn(request(prompt=PROMPT, request_id="pd"), result)
    prefill.learn(request(prompt=PROMPT, request_id="pd"), result)
    assert observed(rec, HIT_BYTES)[0] == 1
    assert not decode._matches and not prefill._matches


def test_matches_waiting_for_a_decision_are_bounded():
    p = producer()
    p.bind_metrics(MetricsRecorder())
    eps = [endpoint("a")]
    for i in range(MATCHES_KEPT + 10):
        p.produce(CycleState(), request(prompt=PROMPT, request_id=f"r{i}"), eps)
    assert len(p._matches) == MATCHES_KEPT


def test_the_combined_scorers_producer_records_under_the_scorers_name_once():
    cfg = load_config({"plugins": [{"name": "prefix", "type": "prefix-cache-scorer"}]})
    profile = build_plugins(cfg).profiles["default"]
    rec = MetricsRecorder()
    assert bind_plugin_metrics(profile.plugins(), rec) == 1  # the producer: the scorer records nothing
    assert bind_plugin_metrics(profile.plugins(), rec) == 1  # bound again (another call): no new collector
    eps = [endpoint("a")]
    req = request(prompt=PROMPT)
    result = profile.run(req, CycleState(), eps)
    Lifecycle(profile.plugins()).pre_request(req, SchedulingResult({"default": result}, "default"))
    labels = ("prefix", "approx-prefix-cache-producer")
    assert observed(rec, HIT_BYTES, labels)[0] == 1
    assert [key for key in rec.state()["gauges"] if key[0] == INDEX_SIZE] == [(INDEX_SIZE, labels)]


def test_the_precise_producer_has_no_prefix_indexer_families():
    cfg = load_config(
        """
plugins:
- type: precise-prefix-cache-producer
- type: prefix-cache-scorer
  parameters: {prefixMatchInfoProducerName: precise-prefix-cache-producer}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: prefix-cache-scorer}]
"""
    )
    rec = MetricsRecorder()
    bind_plugin_metrics(build_plugins(cfg).plugins.values(), rec)
    assert rec.state()["gauges"] == {}
