"""The multi-cycle loop (GIE PR #862 and PR #1013): a handler picks profiles over several rounds, a failed
profile maps to None with its key present, a runaway handler is stopped, and the same coroutine
runs without an event loop (run_sync) or awaited with profiles that really suspend (the Ray path)."""

import asyncio

import pytest

from scheduler import (
    CycleState,
    ErrorCode,
    Scheduler,
    SchedulerProfile,
    SchedulingError,
    SchedulingTrace,
    WeightedScorer,
    run_profile,
    schedule_cycles,
)
from scheduler.cycle_state import profile_error_key
from scheduler.loop import MAX_ROUNDS, run_sync
from tests.scheduler.fakes import FakePlugin, ScriptedHandler
from tests.scheduler.helpers import endpoint, request

PODS = ["pod1", "pod2", "pod3"]


def profile(name, pick, keep=PODS, score=0.5):
    plugin = FakePlugin(f"{name}-plugin", keep=list(keep), score=score, pick=pick)
    return SchedulerProfile(name, filters=[plugin], scorers=[WeightedScorer(plugin, 2)], picker=plugin)


def profiles():
    return {
        "a": profile("a", pick="pod1"),
        "b": profile("b", pick="pod2"),
        "c": profile("c", pick="pod3", keep=[]),  # its filter removes everything: it fails
    }


def endpoints():
    return [endpoint(n) for n in PODS]


def test_handler_picks_profiles_over_several_rounds():
    handler = ScriptedHandler([["a"], ["b", "c"]], primary="a")
    trace = SchedulingTrace()
    result = Scheduler(handler, profiles()).schedule(request(), endpoints(), trace)
    assert trace.rounds == [["a"], ["b", "c"]]
    # Round by round the handler sees what ran before: nothing, then a, then a, b and c.
    assert [sorted(seen) for seen in handler.seen] == [[], ["a"], ["a", "b", "c"]]
    assert result.to_json() == {"primary_profile": "a", "profiles": {"a": ["pod1"], "b": ["pod2"], "c": None}}


def test_failed_profile_leaves_none_with_its_key_present():
    handler = ScriptedHandler([["a", "c"]], primary="a")
    state = CycleState()
    result = run_sync(schedule_cycles(handler, profiles(), _runner(profiles()), request(), endpoints(), state))
    assert "c" in result.profile_results and result.profile_results["c"] is None
    assert handler.seen[-1]["c"] is None and "c" in handler.seen[-1]
    err = state.read(profile_error_key("c"))
    assert isinstance(err, SchedulingError) and err.code is ErrorCode.INTERNAL  # why, for the handler


def test_max_rounds_guard():
    handler = ScriptedHandler([["a"]], primary="a", forever=True)
    with pytest.raises(SchedulingError) as err:
        Scheduler(handler, profiles()).schedule(request(), endpoints())
    assert err.value.code is ErrorCode.INTERNAL and str(MAX_ROUNDS) in err.value.message
    assert len(handler.seen) == MAX_ROUNDS


def test_unknown_profile_is_an_internal_error():
    with pytest.raises(SchedulingError) as err:
        Scheduler(ScriptedHandler([["nope"]], primary="a"), profiles()).schedule(request(), endpoints())
    assert err.value.code is ErrorCode.INTERNAL and "nope" in err.value.message


def test_no_profile_run_is_an_internal_error():
    with pytest.raises(SchedulingError) as err:
        Scheduler(ScriptedHandler([], primary="a"), profiles()).schedule(request(request_id="r9"), endpoints())
    assert err.value.code is ErrorCode.INTERNAL and "r9" in err.value.message


def test_trace_records_filter_removals_scores_and_errors():
    handler = ScriptedHandler([["a", "c"]], primary="a")
    pa = profile("a", pick="pod1", keep=["pod1", "pod2"], score=0.25)
    trace = SchedulingTrace()
    Scheduler(handler, {"a": pa, "c": profiles()["c"]}).schedule(request(), endpoints(), trace)
    a = trace.profiles["a"]
    assert a["filters"] == [{"plugin": "a-plugin", "type": "fake", "removed": ["pod3"], "kept": ["pod1", "pod2"]}]
    assert a["scorers"] == [{"plugin": "a-plugin", "type": "fake", "weight": 2, "scores": {"pod1": 0.25, "pod2": 0.25}}]
    assert a["totals"] == {"pod1": 0.5, "pod2": 0.5} and a["picked"] == ["pod1"] and a["error"] is None
    c = trace.profiles["c"]
    assert c["filters"][0]["removed"] == PODS and c["scorers"] == [] and c["picked"] == []
    assert c["error"] == "no endpoints available for the given request"
    assert trace.to_json()["rounds"] == [["a", "c"]]


def test_timer_sees_every_extension_point():
    calls = []
    handler = ScriptedHandler([["a"]], primary="a")
    sched = Scheduler(handler, profiles(), timer=lambda point, plugin, secs: calls.append((point, plugin.name)))
    sched.schedule(request(), endpoints())
    assert calls == [
        ("ProfilePicker", "scripted"),
        ("Filter", "a-plugin"),
        ("Scorer", "a-plugin"),
        ("Picker", "a-plugin"),
        ("ProfilePicker", "scripted"),
        ("ProcessProfilesResults", "scripted"),
    ]


async def _done(value):
    return value


async def _suspends():
    await asyncio.sleep(0)
    return 1


def test_run_sync():
    assert run_sync(_done(42)) == 42
    with pytest.raises(RuntimeError, match="suspended"):
        run_sync(_suspends())


def _runner(profs, suspend=False):
    async def run(names, req, state, eps, trace):
        if suspend:
            await asyncio.sleep(0)  # as a Ray call would
        return {n: run_profile(profs[n], req, state, eps, trace) for n in names}

    return run


async def test_the_same_loop_awaited_with_profiles_that_suspend():
    profs = profiles()
    handler = ScriptedHandler([["a"], ["b", "c"]], primary="b")
    result = await schedule_cycles(handler, profs, _runner(profs, suspend=True), request(), endpoints())
    assert result.to_json() == {"primary_profile": "b", "profiles": {"a": ["pod1"], "b": ["pod2"], "c": None}}
    with pytest.raises(RuntimeError):
        run_sync(schedule_cycles(ScriptedHandler([["a"]], "a"), profs, _runner(profs, True), request(), endpoints()))
