"""P/D in one round on the Ray path: the request stream of tests/scheduler/test_pd_one_round.py
through real profile actors (one per profile, the gateway's RayProfileRunner and the loop the
gateway runs), once in sequential rounds and once with `parallelStages: true`. The decisions, and
the state of each actor's stateful plugins (prefix index, prefill ledger), must end the same, while
the one-round run really sent prefill to its actor beside decode and discarded what the decider
turned down."""

from __future__ import annotations

import asyncio
import random

import pytest

from actors import ActorOptions
from actors.launcher import start_router_profile_actors, stop_router_profile_actors
from bench.parallel_profiles import plugin_state, same_tie_salt
from scheduler import CycleState, SchedulingError, build_plugins, load_config, schedule_cycles
from scheduler.loop import CYCLE_SEED_KEY
from scheduler.trace import SchedulingTrace
from serve_app.gateway.ray_runner import RayProfileRunner
from tests.conftest import RAY_TEST_NAMESPACE
from tests.scheduler.test_pd_one_round import pd_config, scheduled, stream

REQUESTS = 300


async def _drive(cfg: dict, actors: dict) -> tuple[list, list]:
    """The stream through the actors, as the gateway schedules: the loop with the handler here and
    each profile in its actor, then PreRequest (and, for half the requests, the completion) as the
    events that ride with the next call."""
    built = build_plugins(load_config(cfg))
    handler = built.handler
    profiles = {name: name for name in actors}
    runner = RayProfileRunner(actors, built.body_fields)
    seeds = random.Random(99)  # the same cycle seed per request in both runs
    outcomes, rounds = [], []
    for req, endpoints, complete in stream(REQUESTS, seed=7):
        state = CycleState()
        state.write(CYCLE_SEED_KEY, seeds.getrandbits(64))
        trace = SchedulingTrace()
        try:
            result = await schedule_cycles(handler, profiles, runner, req, endpoints, state, trace)
        except SchedulingError as err:
            runner.withdraw(req)  # as the gateway does: the actors take back what they told their ledgers
            outcomes.append(("error", err.code, err.message))
        else:
            outcomes.append(scheduled(result, trace))
            runner.pre_request(req, result)
            if complete:
                runner.response_complete(req, result.profile_results["decode"].target_endpoints[0].name)
        rounds.append(trace.rounds)
    # The last events leave on their own (notify_delay_s); an info() behind them sees them applied.
    await asyncio.sleep(0.1)
    infos = await asyncio.gather(*(a.info.remote() for a in actors.values()))
    assert all(i["hook_errors"] == 0 for i in infos), infos
    return outcomes, rounds


@pytest.fixture(scope="module")
def runs(ray_session):
    ray = ray_session
    out = {}
    options = ActorOptions(push_plugin_metrics=False)  # tentative decisions on, as by default
    for parallel in (False, True):
        cfg = pd_config(parallel)
        actors = start_router_profile_actors(cfg, namespace=RAY_TEST_NAMESPACE, options=options)
        try:
            assert all(ray.get([a.__ray_call__.remote(same_tie_salt) for a in actors.values()], timeout=60))
            outcomes, rounds = asyncio.run(_drive(cfg, actors))
            state = {name: ray.get(a.__ray_call__.remote(plugin_state)) for name, a in actors.items()}
            calls = {name: ray.get(a.info.remote())["calls"] for name, a in actors.items()}
        finally:
            stop_router_profile_actors(cfg, namespace=RAY_TEST_NAMESPACE)
        out[parallel] = {"outcomes": outcomes, "rounds": rounds, "state": state, "calls": calls}
    return out


def test_profile_actors_decide_and_learn_the_same_in_one_round_as_in_sequential_rounds(runs):
    seq, par = runs[False], runs[True]
    for i, (a, b) in enumerate(zip(seq["outcomes"], par["outcomes"], strict=True)):
        assert a == b, f"request r{i}: sequential {a} vs one round {b}"
    for profile in ("decode", "prefill"):
        assert seq["state"][profile]["index"] == par["state"][profile]["index"], profile
        assert seq["state"][profile]["ledger"] == par["state"][profile]["ledger"], profile
        assert seq["state"][profile]["index"], profile  # the index did learn

    # The stream covers every case: prefill-decode, decode-only, a failed prefill, a failed decode.
    records = [o[3] for o in seq["outcomes"] if o[0] == "ok"]
    decisions = [r["decision"] for r in records]
    assert decisions.count("prefill-decode") >= 30 and decisions.count("decode-only") >= 100
    assert any(o[0] == "ok" and o[2].get("prefill", 0) is None for o in seq["outcomes"])  # decode-only fallback
    assert sum(o[0] == "error" for o in seq["outcomes"]) >= 3  # no decode pod: an error
    assert any(r.get("prefill") == "failed" for r in records)

    # One round really ran prefill in its actor beside decode, and threw some of it away.
    assert all(len(r) <= 1 for r in par["rounds"])
    assert sum(1 for r in par["rounds"] if r and r[0] == ["decode", "prefill"]) >= 100
    assert any(len(r) == 2 for r in seq["rounds"])
    discarded = par["calls"]["prefill"] - seq["calls"]["prefill"]
    assert discarded >= 30, (seq["calls"], par["calls"])
    assert par["calls"]["decode"] == seq["calls"]["decode"]
