"""inflight-load-producer's counting (llm-d/llm-d-router pkg/epp/framework/plugins/requestcontrol/
dataproducer/inflightload/producer_test.go's lifecycle), token-load-scorer (scorer/tokenload) and
concurrency-detector (flowcontrol/saturationdetector/concurrency/detector_test.go) as tables, and
both steering a real scheduler away from the endpoint with work in flight."""

from __future__ import annotations

import pytest

from scheduler import Scheduler
from scheduler.admission import admission_detectors, pool_saturated
from scheduler.config import load_config
from scheduler.config.report import config_report
from scheduler.errors import ConfigError
from scheduler.plugins.detectors.concurrency_detector import ConcurrencyDetector
from scheduler.plugins.support.inflight_load_count import INFLIGHT_LOAD, InFlightLoad, InFlightSnapshot, LoadEstimate
from scheduler.plugins.support.prefix import PREFIX_MATCH_KEY, PrefixCacheMatchInfo
from scheduler.types import Endpoint, ProfileRunResult, SchedulingResult
from tests.scheduler.helpers import FakeClock, endpoint, fresh_state, names, request

PROMPT = "abcd" * 100  # 100 estimated tokens


def result(decode="d", prefill=None, cached=0) -> SchedulingResult:
    target = Endpoint(decode, attributes={PREFIX_MATCH_KEY: PrefixCacheMatchInfo(cached, 100, 16)} if cached else {})
    runs = {"decode": ProfileRunResult([target])}
    if prefill:
        runs["prefill"] = ProfileRunResult([Endpoint(prefill)])
    return SchedulingResult(runs, "decode")


@pytest.mark.parametrize(
    ("estimate", "body_extra", "decided", "after_add", "after_first"),
    [
        # (requests, tokens) after PreRequest, then after the first token
        (LoadEstimate(), {}, result(), ({"d": 1}, {"d": 100}), ({"d": 1}, {})),
        # the cached prefix on the target is not counted (4 blocks of 16 tokens)
        (LoadEstimate(), {}, result(cached=4), ({"d": 1}, {"d": 36}), ({"d": 1}, {})),
        # P/D: the prefill pod is done at the first token
        (
            LoadEstimate(),
            {},
            result(prefill="p"),
            ({"d": 1, "p": 1}, {"d": 100, "p": 100}),
            ({"d": 1}, {}),
        ),
        # output estimate: round(100 * 1.5), held until the end
        (LoadEstimate(add_output=True), {}, result(), ({"d": 1}, {"d": 250}), ({"d": 1}, {"d": 250})),
        # ... capped by the client's max_tokens, and by maxEstimatedOutputTokens
        (LoadEstimate(add_output=True), {"max_tokens": 20}, result(), ({"d": 1}, {"d": 120}), ({"d": 1}, {"d": 120})),
        (
            LoadEstimate(add_output=True, max_output=5),
            {"max_tokens": 20},
            result(),
            ({"d": 1}, {"d": 105}),
            ({"d": 1}, {"d": 105}),
        ),
    ],
)
def test_counting(estimate, body_extra, decided, after_add, after_first):
    load = InFlightLoad(estimate)
    req = request(prompt=PROMPT, request_id="r1")
    req.body.update(body_extra)
    load.add(req, decided)
    assert (load.requests(), load.tokens()) == after_add
    load.first_token(req)
    assert (load.requests(), load.tokens()) == after_first
    load.complete(req)
    assert (load.requests(), load.tokens()) == ({}, {})  # the response's end releases everything


def test_a_lost_response_is_dropped_after_the_timeout():
    load = InFlightLoad(LoadEstimate())
    load.clock = clock = FakeClock()
    load.add(request(prompt=PROMPT), result())
    clock.now += 601
    assert load.requests() == {} and load.tokens() == {}


def build(plugins, profile_refs=None):
    doc = {"plugins": plugins}
    if profile_refs is not None:
        doc["schedulingProfiles"] = [{"name": "default", "plugins": [{"pluginRef": r} for r in profile_refs]}]
    return Scheduler.from_config(load_config(doc))


PRODUCER = "inflight-load-producer"


def produced(sched, req, eps, state=None):
    """A cycle state with what the in-flight load producer writes for `req` (as a profile run has)."""
    state = state if state is not None else fresh_state()
    sched.plugins[PRODUCER].produce(state, req, eps)
    return state


def test_token_load_scorer_scores_and_steers():
    sched = build([{"type": "token-load-scorer", "parameters": {"queueThresholdTokens": 400}}])
    scorer, producer = sched.plugins["token-load-scorer"], sched.plugins[PRODUCER]  # the producer made for it
    eps = [endpoint("a"), endpoint("b")]
    first = sched.schedule(request(prompt=PROMPT, request_id="r1"), eps)  # PreRequest counts it
    busy = first.profile_results["default"].target_endpoints[0].name
    req = request(prompt=PROMPT)
    scores = {e.name: s for e, s in scorer.score(produced(sched, req, eps), req, eps).items()}
    # in flight (100 on the busy one) plus what this request adds there (100, nothing cached)
    assert scores[busy] == pytest.approx(0.5) and scores[({"a", "b"} - {busy}).pop()] == pytest.approx(0.75)
    second = sched.schedule(request(prompt=PROMPT, request_id="r2"), eps)
    assert second.profile_results["default"].target_endpoints[0].name != busy
    sched.response_complete(request(request_id="r1"), busy)
    assert producer.load.tokens() == {({"a", "b"} - {busy}).pop(): 100}


def test_token_load_scorer_counts_this_request_less_what_each_endpoint_has_cached():
    """llm-d's current-request load: equal in-flight load, the endpoint holding 4 of the prompt's
    blocks (64 of its 100 tokens) would take 36 tokens, the other 100."""
    sched = build([{"type": "token-load-scorer", "parameters": {"queueThresholdTokens": 400}}])
    state = fresh_state()
    state.set_endpoint_attributes(PREFIX_MATCH_KEY, {"warm": PrefixCacheMatchInfo(4, 100, 16)})
    eps, req = [endpoint("warm"), endpoint("cold")], request(prompt=PROMPT)
    scorer = sched.plugins["token-load-scorer"]
    scores = {e.name: s for e, s in scorer.score(produced(sched, req, eps, state), req, eps).items()}
    assert scores == {"warm": pytest.approx(1 - 36 / 400), "cold": pytest.approx(1 - 100 / 400)}


def test_the_configured_producer_sets_how_consumers_count():
    sched = build(
        [
            {"type": "inflight-load-producer", "parameters": {"addEstimatedOutputTokens": True, "outputRatio": 1.0}},
            {"type": "token-load-scorer"},
        ]
    )
    sched.schedule(request(prompt=PROMPT, request_id="r1"), [endpoint("a")])
    snapshot = produced(sched, request(prompt=PROMPT), [endpoint("a")]).get(INFLIGHT_LOAD)
    assert snapshot == InFlightSnapshot({"a": 1}, {"a": 200}, 100, 100)


def test_consumers_read_the_producer_they_name():
    """utilization-filter's inFlightLoadProducerName picks whose counts it reads (llm-d's DataKey)."""
    sched = build(
        [
            {"type": "inflight-load-producer", "name": "strict"},
            {
                "type": "utilization-filter",
                "parameters": {
                    "conditions": [{"metric": "active-requests", "maxValue": 0}],
                    "inFlightLoadProducerName": "strict",
                },
            },
        ],
        ["utilization-filter"],
    )
    assert PRODUCER not in sched.plugins  # the named one is read: no default is made
    sched.schedule(request(request_id="r1"), [endpoint("a"), endpoint("b")])
    busy = next(iter(sched.plugins["strict"].load.requests()))
    assert names(sched.schedule(request(request_id="r2"), [endpoint("a"), endpoint("b")]).profile_results["default"]
                 .target_endpoints) == [({"a", "b"} - {busy}).pop()]  # fmt: skip


@pytest.mark.parametrize(
    ("params", "requests", "tokens", "saturation", "kept"),
    [
        ({"maxConcurrency": 2}, {"a": 2, "b": 1}, {}, 0.5, ["b", "c"]),
        ({"maxConcurrency": 2, "headroom": 0.5}, {"a": 2, "b": 3}, {}, 5 / 6, ["a", "c"]),
        ({"concurrencyMode": "tokens", "maxTokenConcurrency": 100}, {}, {"a": 150, "b": 30}, 0.6, ["b", "c"]),
        (
            {"concurrencyMode": "hybrid", "maxConcurrency": 2, "maxTokenConcurrency": 100},
            {"a": 2},
            {"b": 100},
            2 / 3,
            ["c"],
        ),
    ],
)
def test_concurrency_detector(params, requests, tokens, saturation, kept):
    sched = build([{"type": "concurrency-detector", "parameters": params}], ["concurrency-detector"])
    detector, load = sched.plugins["concurrency-detector"], sched.plugins[PRODUCER].load
    for name, n in requests.items():
        for i in range(n):
            load.requests_ledger.add(f"{name}{i}", [(name, 1)])
    for name, n in tokens.items():
        load.tokens_ledger.add(f"t{name}", [(name, n)])
    eps = [endpoint("a"), endpoint("b"), endpoint("c")]
    assert detector.saturation(eps) == pytest.approx(saturation)  # the live view: no cycle at admission
    assert names(detector.filter(produced(sched, request(), eps), request(), eps)) == kept
    assert names(detector.filter(fresh_state(), request(), eps)) == names(eps)  # no data: keeps all
    assert detector.saturation([]) == 1.0


def test_concurrency_detector_sheds_once_the_pool_is_full():
    sched = build(
        [{"type": "concurrency-detector", "parameters": {"maxConcurrency": 1}}, {"type": "queue-scorer"}],
        ["queue-scorer"],
    )
    doc_named = admission_detectors(sched.plugins.values(), named="concurrency-detector")
    eps = [endpoint("a"), endpoint("b")]
    for i in range(2):
        res = sched.schedule(request(prompt=PROMPT, request_id=f"r{i}"), eps)
        assert not pool_saturated(doc_named, eps) or i == 1
        assert res.profile_results["default"] is not None
    assert pool_saturated(doc_named, eps)  # the producer counted both decisions


def test_a_detector_outside_a_config_sees_no_load():
    assert ConcurrencyDetector().saturation([endpoint("a")]) == 0.0


@pytest.mark.parametrize(
    ("consumer", "expect"),
    [
        ("token-load-scorer", "reads the data key 'inflight-load/inflight-load-producer', which no plugin"),
        ("concurrency-detector", "is a queue-scorer, which counts no requests in flight"),
    ],
)
def test_a_plugin_called_inflight_load_producer_must_be_one(consumer, expect):
    with pytest.raises(ConfigError, match=expect):
        load_config({"plugins": [{"type": "queue-scorer", "name": "inflight-load-producer"}, {"type": consumer}]})


def test_validate_shows_the_producer_made_for_its_consumers():
    report = config_report({"plugins": [{"type": "token-load-scorer"}]})
    line = next(ln for ln in report.lines if "'inflight-load-producer'" in ln.where)
    assert line.status == "runs" and "made with its defaults" in line.why and "profile actor" in line.why
