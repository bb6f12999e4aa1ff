"""prefill-backlog-detector and the admission rule (scheduler/admission.py): table-driven."""

import pytest

from scheduler import ProfileRunResult, SaturationDetector, Scheduler, SchedulingResult
from scheduler.admission import admission_detectors, pool_saturated
from scheduler.plugins.detectors.prefill_backlog import PrefillBacklogDetector, PrefillBacklogDetectorParameters
from scheduler.plugins.detectors.utilization_detector import UtilizationDetector
from tests.scheduler.helpers import FakeClock, endpoint, request

PODS = [endpoint("pod-a"), endpoint("pod-b")]


def detector(**params) -> PrefillBacklogDetector:
    d = PrefillBacklogDetector(params=PrefillBacklogDetectorParameters(**params))
    d.clock = FakeClock()
    return d


def send(d: PrefillBacklogDetector, pod: int, chars: int, request_id: str):
    req = request(prompt="x" * chars, request_id=request_id)
    d.pre_request(req, SchedulingResult({"default": ProfileRunResult([PODS[pod]])}, primary_profile_name="default"))
    return req


@pytest.mark.parametrize(
    ("line", "sent", "saturation"),
    [
        pytest.param(1024, [], 0.0, id="idle"),
        pytest.param(1024, [(0, 4096)], 0.5, id="1,024 tokens on one of two pods: half the line"),
        pytest.param(1024, [(0, 4096), (1, 4096)], 1.0, id="the line reached: saturated"),
        pytest.param(512, [(0, 4096)], 1.0, id="a lower line"),
        pytest.param(1024, [(0, 8192), (0, 8192)], 2.0, id="both on one pod count for the pool"),
    ],
)
def test_saturation_is_the_average_backlog_over_the_line(line, sent, saturation):
    d = detector(maxBacklogTokens=line)
    for i, (pod, chars) in enumerate(sent):
        send(d, pod, chars, f"r{i}")
    assert d.saturation(PODS) == pytest.approx(saturation)
    assert d.is_pool_saturated(PODS) is (saturation >= 1.0)


def test_no_endpoints_is_saturated_and_first_tokens_free_the_pool():
    d = detector(maxBacklogTokens=100)
    assert d.is_pool_saturated([])
    req = send(d, 0, 4000, "r1")
    assert d.is_pool_saturated(PODS)
    d.response_first_token(req, "pod-a")
    assert not d.is_pool_saturated(PODS)


def test_parameters():
    assert PrefillBacklogDetector().params.max_backlog_tokens == 1024
    with pytest.raises(ValueError):
        PrefillBacklogDetectorParameters(maxBacklogTokens=0)


def test_gies_utilization_detector_is_added_when_the_config_has_none():
    ours = detector()
    detectors = admission_detectors([ours], queue_depth=3, kv_cache=0.5)
    assert detectors[1] is ours and isinstance(detectors[0], UtilizationDetector)
    assert (detectors[0].params.queue_depth_threshold, detectors[0].params.kv_cache_util_threshold) == (3, 0.5)
    own = UtilizationDetector()
    assert admission_detectors([own, ours]) == [own, ours]
    assert all(isinstance(d, SaturationDetector) for d in detectors)


@pytest.mark.parametrize(
    ("queue", "backlog_chars", "saturated"),
    [
        pytest.param(0, 0, False, id="neither"),
        pytest.param(5, 0, True, id="scraped queues at GIE's line"),
        pytest.param(0, 8192, True, id="the ledger's line"),
    ],
)
def test_any_detector_saturates_the_pool(queue, backlog_chars, saturated):
    ours = detector()
    if backlog_chars:
        send(ours, 0, backlog_chars, "r1")
    pods = [endpoint("pod-a", waiting_queue_size=queue), endpoint("pod-b", waiting_queue_size=queue)]
    assert pool_saturated(admission_detectors([ours]), pods) is saturated


def test_a_declared_detector_is_fed_by_the_scheduler_outside_any_profile():
    sched = Scheduler.from_config(
        """
plugins:
- type: queue-scorer
- type: prefill-backlog-detector
  parameters: {maxBacklogTokens: 100}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: queue-scorer}]
"""
    )
    d = sched.plugins["prefill-backlog-detector"]
    req = request(prompt="x" * 2000)
    result = sched.schedule(req, PODS)
    assert d.is_pool_saturated(PODS)
    sched.response_complete(req, result.target.name)
    assert not d.is_pool_saturated(PODS)
