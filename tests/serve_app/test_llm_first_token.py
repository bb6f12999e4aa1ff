"""First tokens a Serve request router infers from the replicas' published engine queues
(serve_app/llm_router/first_token.py), and a local mirror's ledger releasing what they name."""

from __future__ import annotations

from scheduler import Endpoint, LLMRequest, ProfileRunResult, SchedulingResult, load_config
from serve_app.llm_router.first_token import ARRIVAL_SLACK_S, FirstTokenInference
from serve_app.llm_router.mirror import RouterMirror
from serve_app.llm_router.stats import EngineStatsMixin, engine_routing_stats, published_queue

BACKLOG_CONFIG = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefill-backlog-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefill-backlog-scorer
"""


def req(i: int) -> LLMRequest:
    return LLMRequest(f"r{i}", "base", {"model": "base", "prompt": "x" * 400})


def test_all_but_the_newest_waiting_of_the_requests_routed_before_the_state_left_the_queue():
    inference = FirstTokenInference()
    for i, at in enumerate([10.0, 10.1, 10.2, 10.3]):
        inference.routed("a", req(i), at)
    inference.routed("b", req(9), 10.0)
    # At 10.25 replica a's engine had 1 waiting: of r0..r2 (routed before), r2 waits; r3 came after.
    assert [r.request_id for r in inference.published("a", 1, 10.25)] == ["r0", "r1"]
    assert inference.published("a", 0, 10.25) == []  # the same state again: judged already
    # r3, routed within ARRIVAL_SLACK_S of the state, may not have reached the engine: kept
    assert [r.request_id for r in inference.published("a", 0, 10.3 + ARRIVAL_SLACK_S / 2)] == ["r2"]
    assert [r.request_id for r in inference.published("a", 0, 10.5)] == ["r3"]
    inference.completed("b", "r9")  # completed before its first token was inferred: not awaited
    assert inference.published("b", 0, 11.0) == [] and len(inference) == 0
    inference.routed("c", req(5), 12.0)
    inference.forget({"a"})  # c went away
    assert len(inference) == 0


def test_only_a_published_engine_queue_is_judged():
    assert published_queue(engine_routing_stats(waiting=2))[0] == 2  # type: ignore[index]
    assert published_queue({}) is None and published_queue(None) is None
    counted = EngineStatsMixin()  # counts of tracked requests: no engine queue unless it has a limit
    assert published_queue(counted.engine_state()) is None
    counted.epp_max_running = 8
    assert published_queue(counted.engine_state()) is not None


def test_a_first_token_releases_the_requests_prompt_from_the_mirrors_ledger():
    mirror = RouterMirror(load_config(BACKLOG_CONFIG), "test")
    scorer = mirror.followers["default"].profile.plugins()[0]
    result = SchedulingResult({"default": ProfileRunResult([Endpoint("a")])}, "default")
    mirror.pre_request(req(1), result)
    mirror.pre_request(req(2), result)
    assert scorer.backlog() == {"a": 200}
    mirror.first_token(req(1), "a")
    assert scorer.backlog() == {"a": 100}
    mirror.response_complete(req(1), "a")  # its completion later changes nothing more
    assert scorer.backlog() == {"a": 100}
    kinds = [e.kind for e in mirror.followers["default"].queue]
    assert kinds == ["pre_request", "pre_request", "first_token", "response_complete"]  # for the actors
