"""A producer that raises is logged and skipped (llm-d's Director logs a failed DataProducer and goes
on): the request is still scheduled, the producer's keys are absent for it (even what it wrote
before raising), and each consumer reads the absence as "no data" and stays neutral. A producer
that keeps failing logs its first failure with the traceback, then one line per PRODUCER_LOG_EVERY."""

from __future__ import annotations

import logging
from typing import ClassVar

import pytest

from scheduler import Scheduler, load_config
from scheduler.cycle_state import CycleState
from scheduler.plugins.producers.approx_prefix import ApproxPrefixCacheProducer
from scheduler.plugins.producers.inflight_load_producer import InFlightLoadProducer
from scheduler.profile import PRODUCER_LOG_EVERY
from scheduler.registry import register
from scheduler.trace import ProfileTrace
from scheduler.types import Endpoint, LLMRequest
from tests.scheduler.helpers import endpoint, request

PROMPT = "abcd" * 100


class _Raises:
    """Writes its keys, then raises: a bug half way through producing."""

    def produce(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> None:
        super().produce(cycle_state, request, endpoints)  # type: ignore[misc]
        assert all(key in cycle_state for key in self.produces)  # type: ignore[attr-defined]
        raise RuntimeError("a producer's bug")


@register
class RaisingInFlightLoadProducer(_Raises, InFlightLoadProducer):
    type_name = "test-raising-inflight-load-producer"
    made_when_needed: ClassVar[bool] = False


@register
class RaisingPrefixProducer(_Raises, ApproxPrefixCacheProducer):
    type_name = "test-raising-prefix-producer"


INFLIGHT = {"type": "test-raising-inflight-load-producer", "name": "inflight-load-producer"}
PREFIX = {"type": "test-raising-prefix-producer", "name": "approx-prefix-cache-producer"}


def kept(trace: ProfileTrace, plugin: str) -> list[str]:
    return next(f["kept"] for f in trace.filters if f["plugin"] == plugin)


def scores(trace: ProfileTrace, plugin: str) -> dict[str, float]:
    return next(s["scores"] for s in trace.scorers if s["plugin"] == plugin)


@pytest.mark.parametrize(
    ("producer", "consumer", "neutral"),
    [
        # no in-flight counts: every endpoint scores alike (none scored: all 0)
        (INFLIGHT, {"type": "token-load-scorer"}, lambda t: scores(t, "token-load-scorer") == {}),
        # a is over its cap of 0 active requests, but without the counts nobody is: both stay
        (
            INFLIGHT,
            {
                "type": "utilization-filter",
                "parameters": {"conditions": [{"metric": "active-requests", "maxValue": 0}]},
            },
            lambda t: kept(t, "utilization-filter") == ["a", "b"],
        ),
        (
            INFLIGHT,
            {"type": "concurrency-detector", "parameters": {"maxConcurrency": 1}},
            lambda t: kept(t, "concurrency-detector") == ["a", "b"],
        ),
        # the prompt is cached on a, but the gate has no load signal: all stay
        (
            INFLIGHT,
            {"type": "prefix-cache-affinity-filter", "parameters": {"maxTTFTPenaltyMs": 1}},
            lambda t: kept(t, "prefix-cache-affinity-filter") == ["a", "b"],
        ),
        # no prefix-match info: no endpoint is preferred
        (PREFIX, {"type": "prefix-cache-scorer"}, lambda t: scores(t, "prefix-cache-scorer") == {"a": 0.0, "b": 0.0}),
    ],
)
def test_a_raising_producer_is_skipped_and_its_consumers_see_no_data(producer, consumer, neutral):
    plugins = [producer, consumer]
    if producer is INFLIGHT and consumer["type"] == "prefix-cache-affinity-filter":
        plugins.append({"type": "approx-prefix-cache-producer"})  # the match the gate needs
    if producer is PREFIX:
        plugins.append({"type": "inflight-load-producer"})
    sched = Scheduler.from_config(load_config({"plugins": plugins}))
    eps = [endpoint("a"), endpoint("b")]
    first = sched.schedule(request(prompt=PROMPT, request_id="r1"), eps, run_pre_request=False)
    target = first.profile_results["default"].target_endpoints[0]
    sched.pre_request(request(prompt=PROMPT, request_id="r1"), first)  # a request in flight on `target`
    profile = sched.profiles["default"]
    trace, state = ProfileTrace("default"), CycleState()
    result = profile.run(request(prompt=PROMPT, request_id="r2"), state, eps, trace)
    assert result.target_endpoints  # scheduled all the same
    raising = sched.plugins[producer["name"]]
    assert raising.produces and not any(key in state for key in raising.produces)  # its keys are absent
    trace.filters = [{**f, "kept": sorted("a" if n == target.name else "b" for n in f["kept"])} for f in trace.filters]
    trace.scorers = [
        {**s, "scores": {"a" if n == target.name else "b": v for n, v in s["scores"].items()}} for s in trace.scorers
    ]
    assert neutral(trace)  # `a` is the endpoint with the request in flight and the prompt cached
    assert profile.producer_failures == {producer["name"]: 2}


def test_a_producer_that_keeps_failing_logs_once_per_n(caplog):
    sched = Scheduler.from_config(load_config({"plugins": [INFLIGHT, {"type": "token-load-scorer"}]}))
    with caplog.at_level(logging.WARNING, logger="ray_epp.scheduler.profile"):
        for i in range(PRODUCER_LOG_EVERY + 1):
            sched.schedule(request(prompt=PROMPT, request_id=f"r{i}"), [endpoint("a")])
    logged = [r for r in caplog.records if r.name == "ray_epp.scheduler.profile"]
    assert len(logged) == 2  # the 1st failure and the 101st
    assert logged[0].exc_info and not logged[1].exc_info  # the traceback once
    assert "'inflight-load-producer' failed on request r0 (1 failures in profile 'default')" in logged[0].getMessage()
    assert "(101 failures" in logged[1].getMessage()
