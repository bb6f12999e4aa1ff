"""A profile actor tells its ledgers each decision as it makes it (actors/tentative_decisions.py):
a batch of calls decided on one snapshot spreads instead of herding onto the emptiest endpoint; the
gateway's final PreRequest replaces the tentative entry (nothing counted twice); a withdraw, or
silence past the TTL, takes it back. Real Ray, a real profile actor."""

from __future__ import annotations

import time

import pytest

from actors import ActorOptions
from actors.launcher import start_router_profile_actors, stop_router_profile_actors
from actors.protocol import ProfileCall, ProfileEvent
from scheduler import CycleState, ProfileRunResult, SchedulingResult
from scheduler.lifecycle import LifecycleEvent
from scheduler.plugins.scorers.prefill_backlog import PrefillBacklogScorer
from tests.conftest import RAY_TEST_NAMESPACE
from tests.scheduler.helpers import endpoint, request

CONFIG = """
plugins:
- type: prefill-backlog-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefill-backlog-scorer
  - pluginRef: max-score-picker
"""
ENDPOINTS = [endpoint(f"pod-{i}") for i in range(4)]
PROMPT = "x" * 1600  # 400 estimated tokens
PRIOR = "y" * 400  # 100 tokens: pod-1..3 start with this much, pod-0 with none


def backlog(actor) -> dict[str, int]:
    """Run in the profile actor: its prefill-backlog-scorer's ledger."""
    [scorer] = [p for p in actor.profile.plugins() if isinstance(p, PrefillBacklogScorer)]
    return dict(scorer.backlog())


def short_ttl(actor) -> float:
    actor._tentative.ttl_s = 0.3
    return actor._tentative.ttl_s


def call(i: int) -> ProfileCall:
    return ProfileCall(request(prompt=PROMPT, request_id=f"r{i}"), CycleState(), endpoints=ENDPOINTS)


def final(i: int, target) -> ProfileEvent:
    req = request(prompt=PROMPT, request_id=f"r{i}")
    return ProfileEvent(LifecycleEvent.PRE_REQUEST, req, result=SchedulingResult({"default": target}, "default"))


@pytest.fixture(scope="module")
def actor(ray_session):
    actors = start_router_profile_actors(
        CONFIG, namespace=RAY_TEST_NAMESPACE, options=ActorOptions(push_plugin_metrics=False)
    )
    yield actors["default"]
    stop_router_profile_actors(CONFIG, namespace=RAY_TEST_NAMESPACE)


def test_a_batch_decided_on_one_snapshot_spreads_and_the_final_decision_replaces_the_tentative(ray_session, actor):
    ray = ray_session
    prior = [
        ProfileEvent(LifecycleEvent.PRE_REQUEST, request(prompt=PRIOR, request_id=f"p{i}"),
                     result=SchedulingResult({"default": _result(ENDPOINTS[i])}, "default"))
        for i in (1, 2, 3)
    ]  # fmt: skip
    out = ray.get(actor.run_batch.remote([*prior, *(call(i) for i in range(4))]))
    targets = [o.result.target_endpoints[0].name for o in out[3:]]
    assert targets[0] == "pod-0", targets  # the emptiest, first
    assert sorted(targets) == ["pod-0", "pod-1", "pod-2", "pod-3"], f"the batch herded: {targets}"
    assert ray.get(actor.__ray_call__.remote(backlog)) == {"pod-0": 400, "pod-1": 500, "pod-2": 500, "pod-3": 500}

    # The gateway's PreRequests arrive: the same entries, not a second count.
    ray.get(actor.run_batch.remote([final(i, o.result) for i, o in enumerate(out[3:])]))
    assert ray.get(actor.__ray_call__.remote(backlog)) == {"pod-0": 400, "pod-1": 500, "pod-2": 500, "pod-3": 500}
    info = ray.get(actor.info.remote())
    assert info["tentative"] == {"held": 0, "told": 4, "withdrawn": 0, "expired": 0}

    # Done: the ledgers are empty again.
    ids = [f"r{i}" for i in range(4)] + [f"p{i}" for i in (1, 2, 3)]
    ended = [ProfileEvent(LifecycleEvent.RESPONSE_COMPLETE, request(request_id=rid), endpoint_name="x") for rid in ids]
    ray.get(actor.run_batch.remote(ended))
    assert ray.get(actor.__ray_call__.remote(backlog)) == {}


def test_a_withdrawn_or_unconfirmed_decision_is_taken_back(ray_session, actor):
    ray = ray_session
    [a] = ray.get(actor.run_batch.remote([call(10)]))
    assert ray.get(actor.__ray_call__.remote(backlog)) == {a.result.target_endpoints[0].name: 400}
    withdraw = ProfileEvent(LifecycleEvent.WITHDRAW, request(request_id="r10"))
    ray.get(actor.run_batch.remote([withdraw]))
    assert ray.get(actor.__ray_call__.remote(backlog)) == {}
    assert ray.get(actor.info.remote())["tentative"]["withdrawn"] == 1

    # A decision nobody confirms nor withdraws (its gateway died) lapses after the TTL.
    assert ray.get(actor.__ray_call__.remote(short_ttl)) == 0.3
    ray.get(actor.run_batch.remote([call(11)]))
    assert sum(ray.get(actor.__ray_call__.remote(backlog)).values()) == 400
    time.sleep(0.4)
    [b] = ray.get(actor.run_batch.remote([call(12)]))  # the batch first withdraws what lapsed
    assert ray.get(actor.__ray_call__.remote(backlog)) == {b.result.target_endpoints[0].name: 400}
    info = ray.get(actor.info.remote())
    assert info["tentative"]["expired"] == 1 and info["hook_errors"] == 0


def _result(target) -> ProfileRunResult:
    return ProfileRunResult([target])
