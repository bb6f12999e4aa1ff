"""One lifecycle (scheduler/lifecycle.py): the events that cross processes are delivered by their
`LifecycleEvent`, only to the plugins that declare the event's role; where each real plugin runs
(scheduler/config/placement.py); and clocks and generators reach plugins through their handle."""

import random
from pathlib import Path

import pytest

from scheduler import PreRequest, ResponseComplete, ResponseFirstToken, SchedulingResult, load_config_file
from scheduler.config import Placement, build_for, build_plugins, load_config
from scheduler.interfaces import PluginHandle, TentativePreRequest
from scheduler.lifecycle import EVENT_ROLES, Lifecycle, LifecycleEvent
from scheduler.registry import plugin_class
from scheduler.types import ProfileRunResult
from tests.scheduler.fakes import FakePlugin
from tests.scheduler.helpers import endpoint, request

GATEWAY, ACTOR, ROUTER = Placement.GATEWAY, Placement.PROFILE_ACTOR, Placement.ROUTER
ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "ray_epp" / "configs"
BENCHMARKED = sorted([*CONFIGS.glob("*.yaml"), *(ROOT / "bench" / "configs").glob("*.yaml")])


class Ledger(FakePlugin, TentativePreRequest, ResponseFirstToken, ResponseComplete):
    def __init__(self, name):
        super().__init__(name, keep=["pod1"], pick="pod1")
        self.heard = []

    def pre_request(self, request, result):
        self.heard.append(("pre", request.request_id))

    def withdraw(self, request):
        self.heard.append(("withdraw", request.request_id))

    def response_first_token(self, request, endpoint_name):
        self.heard.append(("first", endpoint_name))

    def response_complete(self, request, endpoint_name):
        self.heard.append(("done", endpoint_name))


class FinalOnly(FakePlugin, PreRequest):
    def __init__(self, name):
        super().__init__(name, keep=["pod1"], pick="pod1")
        self.heard = []

    def pre_request(self, request, result):
        self.heard.append(("pre", request.request_id))

    def withdraw(self, request):  # not a TentativePreRequest: never called
        self.heard.append(("withdraw", request.request_id))


def decision() -> SchedulingResult:
    return SchedulingResult({"default": ProfileRunResult([endpoint("pod1")])}, "default")


def test_every_event_names_a_role_and_its_method():
    for event, (role, method) in EVENT_ROLES.items():
        assert callable(getattr(role, method, None)), (event, role, method)
    assert set(EVENT_ROLES) == set(LifecycleEvent)


def test_deliver_routes_each_crossing_event_by_role():
    ledger, final = Ledger("ledger"), FinalOnly("final")
    lifecycle = Lifecycle([ledger, final, ledger])  # a plugin listed twice hears once
    req = request(request_id="r1")
    lifecycle.deliver(LifecycleEvent.TENTATIVE, req, decision())
    lifecycle.deliver(LifecycleEvent.WITHDRAW, req)
    lifecycle.deliver(LifecycleEvent.PRE_REQUEST, req, decision())
    lifecycle.deliver(LifecycleEvent.FIRST_TOKEN, req, endpoint_name="pod1")
    lifecycle.deliver(LifecycleEvent.RESPONSE_COMPLETE, req, endpoint_name="pod1")
    lifecycle.deliver(LifecycleEvent.PRE_REQUEST, req)  # without its decision: nothing to tell
    assert ledger.heard == [("pre", "r1"), ("withdraw", "r1"), ("pre", "r1"), ("first", "pod1"), ("done", "pod1")]
    assert final.heard == [("pre", "r1")]
    assert lifecycle.errors == 0


def test_deliver_takes_the_kind_as_sent_and_refuses_what_does_not_cross():
    ledger = Ledger("ledger")
    lifecycle = Lifecycle([ledger])
    lifecycle.deliver("response_complete", request(request_id="r1"), endpoint_name="pod1")  # type: ignore[arg-type]
    assert ledger.heard == [("done", "pod1")]
    with pytest.raises(ValueError, match="response_headers"):
        lifecycle.deliver(LifecycleEvent.RESPONSE_HEADERS, request(), decision())
    with pytest.raises(ValueError):
        lifecycle.deliver("finished", request())  # type: ignore[arg-type]


GATED = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
featureGates: [flowControl]
plugins:
- type: models-responder
- type: approx-prefix-cache-producer
- type: prefix-cache-scorer
- type: queue-scorer
- type: max-score-picker
- type: prefill-backlog-detector
- type: program-aware-fairness
- type: kv-cache-utilization-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-scorer
  - pluginRef: queue-scorer
  - pluginRef: max-score-picker
flowControl:
  priorityBands:
  - priority: 0
    fairnessPolicyRef: program-aware-fairness
"""


def test_placement_of_real_plugins():
    built = build_plugins(load_config(GATED))
    where = built.placement
    assert where["prefix-cache-scorer"] == {ACTOR, ROUTER}
    assert where["max-score-picker"] == {ACTOR, ROUTER}
    # configured but in no profile: a scorer runs nowhere
    assert where["kv-cache-utilization-scorer"] == frozenset()
    # the scorer's producer (in no profile; the scorer looks it up through its handle) runs beside it
    assert where["approx-prefix-cache-producer"] == {ACTOR, ROUTER}
    assert where["prefill-backlog-detector"] == {GATEWAY}  # admission; its ledger hooks go with it
    assert where["program-aware-fairness"] == {GATEWAY}  # the replica's queue, and its usage
    assert where["models-responder"] == {GATEWAY, ACTOR, ROUTER}  # answers at the door, screens in profiles
    assert where["single-profile-handler"] == {GATEWAY, ROUTER}
    gateway = {p.name for p in build_for(load_config(GATED), GATEWAY).plugins}
    assert gateway == {
        "models-responder", "prefill-backlog-detector", "program-aware-fairness", "single-profile-handler",
        # flow control's defaults, added by the loader
        "fcfs-ordering-policy", "global-strict-fairness-policy", "static-usage-limit-policy",
    }  # fmt: skip


def test_placement_of_shipped_configs():
    pd = build_plugins(load_config_file(CONFIGS / "pd.yaml"))
    deciders = [n for n, p in pd.plugins.items() if "decider" in p.type_name]
    assert deciders and all(pd.placement[n] == {GATEWAY, ROUTER} for n in deciders)
    slo = build_plugins(load_config_file(CONFIGS / "slo.yaml"))
    assert slo.placement["predicted-latency-producer"] == {ACTOR, ROUTER}  # read by the profile's plugins


PRECISE = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: precise-prefix-cache-producer
- type: prefix-cache-scorer
  parameters: {prefixMatchInfoProducerName: precise-prefix-cache-producer}
- type: active-request-scorer
- type: max-score-picker
- type: all-profiles-handler
schedulingProfiles:
- name: a
  plugins: [{pluginRef: prefix-cache-scorer}, {pluginRef: max-score-picker}]
- name: b
  plugins: [{pluginRef: active-request-scorer}, {pluginRef: max-score-picker}]
"""


def test_a_profile_actor_hears_its_own_profile_and_feeds_the_kv_sinks():
    cfg = load_config(PRECISE)
    a = build_for(cfg, ACTOR, profile="a")
    assert {p.name for p in a.plugins} == {"precise-prefix-cache-producer", "prefix-cache-scorer", "max-score-picker"}
    assert a.built.placement["precise-prefix-cache-producer"] == {ACTOR, ROUTER}
    b = build_for(cfg, ACTOR, profile="b")
    assert {p.name for p in b.plugins} == {"active-request-scorer", "max-score-picker"}
    assert a.lifecycle.takes_tentative is False and b.lifecycle.takes_tentative is True
    with pytest.raises(ValueError, match="profile 'c' is not in the config"):
        build_for(cfg, ACTOR, profile="c")


def test_validate_report_says_where_each_plugin_runs():
    from scheduler.config.report import config_report

    lines = {line.where: line.why for line in config_report(GATED).lines}
    assert lines["plugin 'prefill-backlog-detector' (type prefill-backlog-detector)"].endswith(
        "runs in: gateway replica"
    )
    assert lines["plugin 'queue-scorer' (type queue-scorer)"].endswith("runs in: profile actor, Serve router")
    assert lines["plugin 'kv-cache-utilization-scorer' (type kv-cache-utilization-scorer)"].endswith(
        "runs in: nowhere (nothing uses it)"
    )


def _clocks_and_generators(config, handle):
    built = build_plugins(config, handle=handle)
    clocks = {n: p.clock for n, p in built.plugins.items() if callable(getattr(p, "clock", None))}
    rngs = {n: p.rng for n, p in built.plugins.items() if isinstance(getattr(p, "rng", None), random.Random)}
    return clocks, rngs


def test_every_plugin_takes_its_clock_and_generator_from_its_handle():
    """What the cluster simulation relies on to repeat a run: no plugin of a benchmarked config
    keeps a clock or a generator the build did not give it."""

    def virtual() -> float:
        return 1_000_000.0

    clocks_seen = rngs_seen = 0
    for policy in BENCHMARKED:
        cfg = load_config_file(policy)
        clocks, rngs = _clocks_and_generators(cfg, PluginHandle(clock=virtual, wall_clock=virtual, seed=7))
        assert all(c is virtual for c in clocks.values()), (policy, clocks)
        again = _clocks_and_generators(cfg, PluginHandle(clock=virtual, wall_clock=virtual, seed=7))[1]
        other = _clocks_and_generators(cfg, PluginHandle(clock=virtual, wall_clock=virtual, seed=8))[1]
        for name, rng in rngs.items():
            assert rng.random() == again[name].random() != other[name].random(), (policy, name)
        clocks_seen += len(clocks)
        rngs_seen += len(rngs)
    assert clocks_seen and rngs_seen


def test_a_plugin_built_in_code_gets_the_real_clocks_and_its_own_generator():
    cls = plugin_class("max-score-picker")
    one, two = cls(name="one"), cls(name="two")
    assert one.rng is not two.rng
    seeded = PluginHandle(seed=3)
    assert seeded.for_plugin("x").rng.random() == random.Random("3:x").random()
    assert seeded.for_plugin("x").rng.random() != seeded.for_plugin("y").rng.random()
