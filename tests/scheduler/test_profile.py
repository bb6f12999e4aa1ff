"""SchedulerProfile: GIE's scheduling/scheduler_profile_test.go cases (filters then weighted
scorers then the picker, each called once; scores clamped to [0, 1]; filters run in order, each on
the previous one's output)."""

import pytest

from scheduler import ErrorCode, SchedulerProfile, SchedulingError, WeightedScorer
from scheduler.cycle_state import FILTER_FAILURE_KEY
from scheduler.profile import NO_ENDPOINTS
from scheduler.trace import ProfileTrace
from tests.scheduler.fakes import FakePlugin, RecordingFilter
from tests.scheduler.helpers import endpoint, fresh_state, names, request


def pods(*pod_names):
    return [endpoint(n) for n in pod_names]


def gie_plugins():
    tp1 = FakePlugin("test1", keep=["pod1", "pod2", "pod3"], score=0.3)
    tp2 = FakePlugin("test2", keep=["pod1", "pod2"], score=0.8)
    filter_all = FakePlugin("filter all", keep=[])
    picker = FakePlugin("picker", pick="pod1")
    return tp1, tp2, filter_all, picker


@pytest.mark.parametrize(
    ("case", "weights", "want_score", "num_to_score"),
    [
        pytest.param("same weights", (1, 1), 1.1, 2, id="all plugins executed successfully, same weight"),
        pytest.param("different weights", (60, 40), 50.0, 2, id="all plugins executed successfully, weights 60/40"),
    ],
)
def test_schedule_plugins(case, weights, want_score, num_to_score):
    tp1, tp2, _, picker = gie_plugins()
    profile = SchedulerProfile(
        "p",
        filters=[tp1, tp2],
        scorers=[WeightedScorer(tp1, weights[0]), WeightedScorer(tp2, weights[1])],
        picker=picker,
    )
    got = profile.run(request("test-model"), fresh_state(), pods("pod1", "pod2", "pod3"))
    assert names(got.target_endpoints) == ["pod1"]
    for p in (tp1, tp2):
        assert p.filter_calls == 1
        assert p.score_calls == 1
        assert p.num_scored == num_to_score
    assert picker.pick_calls == 1
    assert picker.num_pick_candidates == num_to_score
    assert picker.winner_score == pytest.approx(want_score)


def test_filter_all_fails_the_profile_before_scoring():
    tp1, tp2, filter_all, picker = gie_plugins()
    profile = SchedulerProfile(
        "p", filters=[tp1, filter_all], scorers=[WeightedScorer(tp1, 1), WeightedScorer(tp2, 1)], picker=picker
    )
    with pytest.raises(SchedulingError) as err:
        profile.run(request("test-model"), fresh_state(), pods("pod1", "pod2", "pod3"))
    assert err.value.code is ErrorCode.INTERNAL and err.value.message == NO_ENDPOINTS
    assert tp1.score_calls == tp2.score_calls == picker.pick_calls == 0


def test_filters_stop_once_none_is_left():
    log: list[tuple[str, int]] = []
    _, _, filter_all, picker = gie_plugins()
    profile = SchedulerProfile("p", filters=[filter_all, RecordingFilter("after", log)], picker=picker)
    with pytest.raises(SchedulingError):
        profile.run(request(), fresh_state(), pods("pod1"))
    assert log == []


def test_filter_failure_key_gives_the_error():
    class Dropper(FakePlugin):
        def filter(self, cycle_state, request, endpoints):
            cycle_state.write(FILTER_FAILURE_KEY, SchedulingError(ErrorCode.RESOURCE_EXHAUSTED, "shed"))
            return []

    state = fresh_state()
    profile = SchedulerProfile("p", filters=[Dropper("drop")], picker=FakePlugin("picker", pick="pod1"))
    with pytest.raises(SchedulingError) as err:
        profile.run(request(), state, pods("pod1"))
    assert err.value.code is ErrorCode.RESOURCE_EXHAUSTED
    assert FILTER_FAILURE_KEY not in state  # consumed, so it does not leak into the next profile


@pytest.mark.parametrize(
    ("score", "want"),
    [
        pytest.param(-0.5, 0.0, id="negative score clamped to 0"),
        pytest.param(1.5, 1.0, id="score above 1 clamped to 1"),
        pytest.param(0.0, 0.0, id="score at 0 stays 0"),
        pytest.param(1.0, 1.0, id="score at 1 stays 1"),
        pytest.param(0.5, 0.5, id="score in range stays unchanged"),
    ],
)
def test_enforce_score_range(score, want):
    scorer, picker = FakePlugin("s", score=score), FakePlugin("picker", pick="pod1")
    SchedulerProfile("p", scorers=[WeightedScorer(scorer, 1)], picker=picker).run(
        request(), fresh_state(), pods("pod1")
    )
    assert picker.winner_score == want


def test_run_with_out_of_range_scores():
    negative = FakePlugin("negative", keep=["pod1"], score=-0.5)
    over = FakePlugin("over", keep=["pod1"], score=1.5)
    picker = FakePlugin("picker", pick="pod1")
    profile = SchedulerProfile("p", scorers=[WeightedScorer(negative, 1), WeightedScorer(over, 1)], picker=picker)
    profile.run(request(), fresh_state(), pods("pod1"))
    assert picker.winner_score == 1.0  # 0 * 1 + 1 * 1


def test_filter_execution_order():
    log: list[tuple[str, int]] = []
    filters = [RecordingFilter(n, log) for n in ("filter-A", "filter-B", "filter-C")]
    profile = SchedulerProfile("p", filters=filters, picker=FakePlugin("picker", pick="pod1"))
    profile.run(request(), fresh_state(), pods("pod1", "pod2"))
    assert [n for n, _ in log] == ["filter-A", "filter-B", "filter-C"]


def test_filter_chain_receives_previous_output():
    log: list[tuple[str, int]] = []
    filter1 = FakePlugin("filter1", keep=["pod1", "pod2"])
    filter2 = FakePlugin("filter2", keep=["pod1"])
    profile = SchedulerProfile(
        "p", filters=[filter1, filter2, RecordingFilter("filter3", log)], picker=FakePlugin("picker", pick="pod1")
    )
    profile.run(request(), fresh_state(), pods("pod1", "pod2", "pod3"))
    assert log == [("filter3", 1)]


def test_scorer_missing_an_endpoint_adds_nothing_for_it():
    class Partial(FakePlugin):
        def score(self, cycle_state, request, endpoints):
            return {ep: 1.0 for ep in endpoints if ep.name == "pod2"}

    picker = FakePlugin("picker", pick="pod1")
    trace = ProfileTrace("p")
    SchedulerProfile("p", scorers=[WeightedScorer(Partial("partial"), 3)], picker=picker).run(
        request(), fresh_state(), pods("pod1", "pod2"), trace
    )
    assert picker.winner_score == 0.0
    assert trace.totals == {"pod1": 0.0, "pod2": 3.0}


def test_targets_carry_attributes_plugins_attached():
    class Tagger(FakePlugin):
        def score(self, cycle_state, request, endpoints):
            cycle_state.set_endpoint_attribute("pod1", "prefix-match", 7)
            return super().score(cycle_state, request, endpoints)

    original = pods("pod1", "pod2")
    profile = SchedulerProfile("p", scorers=[WeightedScorer(Tagger("tag"), 1)], picker=FakePlugin("pk", pick="pod1"))
    target = profile.run(request(), fresh_state(), original).target_endpoints[0]
    assert target.name == "pod1" and target.attributes == {"prefix-match": 7}
    assert original[0].attributes == {}  # the shared endpoint is not changed


def test_profile_without_picker_is_an_internal_error():
    with pytest.raises(SchedulingError) as err:
        SchedulerProfile("p").run(request(), fresh_state(), pods("pod1"))
    assert err.value.code is ErrorCode.INTERNAL


def test_plugins_lists_each_instance_once_in_order():
    tp1, tp2, _, picker = gie_plugins()
    profile = SchedulerProfile(
        "p", filters=[tp1], scorers=[WeightedScorer(tp1, 1), WeightedScorer(tp2, 2)], picker=picker
    )
    assert profile.plugins() == [tp1, tp2, picker]
