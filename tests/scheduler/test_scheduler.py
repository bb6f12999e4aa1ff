"""The in-process Scheduler: GIE's scheduling/scheduler_test.go cases (the default scorers on a
single profile), plus the PreRequest / ResponseComplete hooks around a decision and the rule they
are dispatched by (scheduler/lifecycle.py; tests/actors checks the profile actors apply the same)."""

import pytest

from scheduler import (
    ErrorCode,
    PreRequest,
    ResponseComplete,
    ResponseFirstToken,
    ResponseHeader,
    Scheduler,
    SchedulerProfile,
    SchedulingError,
    SchedulingTrace,
)
from scheduler.plugins.handlers.single_profile import SingleProfileHandler
from tests.scheduler.fakes import FakePlugin
from tests.scheduler.helpers import endpoint, request

GIE_DEFAULT_CONFIG = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: kv-cache-utilization-scorer
- type: queue-scorer
- type: prefix-cache-scorer
- type: lora-affinity-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: kv-cache-utilization-scorer, weight: 1}
  - {pluginRef: queue-scorer, weight: 1}
  - {pluginRef: prefix-cache-scorer, weight: 1}
  - {pluginRef: lora-affinity-scorer, weight: 1}
  - {pluginRef: max-score-picker}
"""


def gie_pods():
    return [
        endpoint("pod1", waiting_queue_size=0, kv_cache_usage_percent=0.2, max_active_models=2,
                 active_models={"foo": 1, "bar": 1}),
        endpoint("pod2", waiting_queue_size=0, kv_cache_usage_percent=0.2, max_active_models=2,
                 active_models={"foo": 1, "critical": 1}),
        endpoint("pod3", waiting_queue_size=10, kv_cache_usage_percent=0.8, max_active_models=2,
                 active_models={"foo": 1}),
    ]  # fmt: skip


def test_no_candidate_endpoints():
    with pytest.raises(SchedulingError) as err:
        Scheduler.from_config(GIE_DEFAULT_CONFIG).schedule(request("any-model"), [])
    assert err.value.code is ErrorCode.SERVICE_UNAVAILABLE


def test_finds_optimal_endpoint():
    # pod2: lowest queue, the requested model active, low KV cache use:
    # kv 0.8 + queue 1.0 + prefix 0 (nothing cached yet) + lora 1.0 = 2.8
    trace = SchedulingTrace()
    result = Scheduler.from_config(GIE_DEFAULT_CONFIG).schedule(request("critical"), gie_pods(), trace)
    assert result.primary_profile_name == "default"
    assert list(result.profile_results) == ["default"]
    assert [ep.name for ep in result.profile_results["default"].target_endpoints] == ["pod2"]
    assert trace.profiles["default"]["totals"]["pod2"] == pytest.approx(2.8)


class Hooks(FakePlugin, PreRequest, ResponseComplete, ResponseHeader):
    def __init__(self, name, **kw):
        super().__init__(name, **kw)
        self.events = []

    def response_headers(self, request, result):
        return {"x-from": self.name}

    def pre_request(self, request, result):
        self.events.append(("pre", request.request_id, result.target.name))

    def response_complete(self, request, endpoint_name):
        self.events.append(("done", request.request_id, endpoint_name))


def hooked_scheduler():
    hooks = Hooks("hooks", keep=["pod1"], pick="pod1")
    profile = SchedulerProfile("default", filters=[hooks], picker=hooks)
    return Scheduler(SingleProfileHandler(), {"default": profile}), hooks


def test_pre_request_and_response_complete_hooks():
    sched, hooks = hooked_scheduler()
    sched.schedule(request(request_id="r1"), [endpoint("pod1"), endpoint("pod2")])
    sched.schedule(request(request_id="r2"), [endpoint("pod1")], run_pre_request=False)
    sched.response_complete(request(request_id="r1"), "pod1")
    assert hooks.events == [("pre", "r1", "pod1"), ("done", "r1", "pod1")]


def test_failed_schedule_runs_no_pre_request():
    sched, hooks = hooked_scheduler()
    with pytest.raises(SchedulingError) as err:
        sched.schedule(request(request_id="r1"), [endpoint("pod2")])
    assert err.value.code is ErrorCode.RESOURCE_EXHAUSTED  # GIE's director: a failed profile is 429
    assert hooks.events == []


class FailingHooks(FakePlugin, PreRequest, ResponseFirstToken, ResponseComplete, ResponseHeader):
    def pre_request(self, request, result):
        raise RuntimeError("pre_request bug")

    def response_headers(self, request, result):
        raise RuntimeError("response header bug")

    def response_first_token(self, request, endpoint_name):
        raise RuntimeError("first token bug")

    def response_complete(self, request, endpoint_name):
        raise RuntimeError("complete bug")


class Undeclared(FakePlugin, PreRequest):
    """Has response_complete and response_first_token, but declares neither role."""

    def __init__(self, name, **kw):
        super().__init__(name, **kw)
        self.events = []

    def pre_request(self, request, result):
        self.events.append("pre")

    def response_first_token(self, request, endpoint_name):
        self.events.append("first")

    def response_complete(self, request, endpoint_name):
        self.events.append("done")


def scheduler_with(*plugins):
    profile = SchedulerProfile("default", filters=list(plugins), picker=plugins[-1])
    return Scheduler(SingleProfileHandler(), {"default": profile})


def test_a_failing_hook_is_counted_and_neither_stops_the_others_nor_the_decision():
    failing = FailingHooks("failing", keep=["pod1"])
    hooks = Hooks("hooks", keep=["pod1"], pick="pod1")
    sched = scheduler_with(failing, hooks)
    result = sched.schedule(request(request_id="r1"), [endpoint("pod1"), endpoint("pod2")])
    assert result.target.name == "pod1"  # the decision stands although a PreRequest hook raised
    sched.response_first_token(request(request_id="r1"), "pod1")
    sched.response_complete(request(request_id="r1"), "pod1")
    assert sched.response_headers(request(request_id="r1"), result) == {"x-from": "hooks"}
    assert hooks.events == [("pre", "r1", "pod1"), ("done", "r1", "pod1")]
    assert sched.hooks.errors == 4


def test_only_declared_roles_get_hooks():
    undeclared = Undeclared("undeclared", keep=["pod1"], pick="pod1")
    sched = scheduler_with(undeclared)
    sched.schedule(request(request_id="r1"), [endpoint("pod1")])
    sched.response_first_token(request(request_id="r1"), "pod1")
    sched.response_complete(request(request_id="r1"), "pod1")
    assert undeclared.events == ["pre"]
    assert sched.hooks.errors == 0
