"""Flow control in the scheduler layer: the config section and gate, the policies, and the queue
(bands, flows, capacity, TTL, cancel, dispatch gated by saturation), driven by a hand clock."""

from __future__ import annotations

import math

import pytest

from scheduler import Endpoint, Metrics, load_config
from scheduler.config import build_plugins
from scheduler.config.flow_control import FlowControlSpec, parse_feature_gates, parse_quantity
from scheduler.errors import ConfigError
from scheduler.flowcontrol.controller import FlowController, build_flow_controller
from scheduler.flowcontrol.types import FlowItem, FlowQueue, Outcome
from scheduler.interfaces import SaturationDetector
from scheduler.plugins.flowcontrol.edf import EDFOrderingPolicy
from scheduler.plugins.flowcontrol.fcfs import FCFSOrderingPolicy
from scheduler.plugins.flowcontrol.global_strict import GlobalStrictFairnessPolicy
from scheduler.plugins.flowcontrol.round_robin import RoundRobinFairnessPolicy

EPS = [Endpoint(name=f"pod-{i}", metrics=Metrics()) for i in range(2)]


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


class Gate(SaturationDetector):
    """A detector the test opens and closes (a real plugin role, no registry entry)."""

    type_name = "test-gate"

    def setup(self, handle) -> None:
        self.saturated = True

    def is_pool_saturated(self, endpoints):
        return self.saturated or not endpoints


POLICIES = {
    "fcfs-ordering-policy": FCFSOrderingPolicy(),
    "edf-ordering-policy": EDFOrderingPolicy(),
    "global-strict-fairness-policy": GlobalStrictFairnessPolicy(),
    "round-robin-fairness-policy": RoundRobinFairnessPolicy(),
}


def controller(spec: dict | None = None, **kw) -> tuple[FlowController, Gate, Clock, list[FlowItem]]:
    gate, clock, out = Gate(), Clock(), []
    fc = FlowController(FlowControlSpec.model_validate(spec or {}), [gate], POLICIES.__getitem__, clock, **kw)
    return fc, gate, clock, out


def item(rid: str, out: list, priority: int = 0, flow: str = "f", size: int = 10) -> FlowItem:
    return FlowItem(rid, priority, flow, size, on_outcome=out.append)


def drain(fc: FlowController, gate: Gate, out: list) -> list[str]:
    """Open the gate and dispatch everything, one settled request at a time; the dispatch order."""
    gate.saturated = False
    order: list[str] = []
    while fc.size:
        fc.pump(EPS)
        for it in out:
            if it.outcome is Outcome.DISPATCHED and it.request_id not in order:
                order.append(it.request_id)
                fc.settled(it)
    return order


# ---- config ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text,value",
    [(100, 100), ("100", 100), ("1k", 1000), ("1Ki", 1024), ("500M", 500_000_000), ("1Gi", 2**30),
     ("1.5k", 1500), ("1e3", 1000), ("100m", 1), ("0", 0)],
)  # fmt: skip
def test_quantities_as_kubernetes_writes_them(text, value):
    assert parse_quantity(text) == value


@pytest.mark.parametrize("bad", ["-1", "1 kb", "lots", True, [1]])
def test_a_bad_quantity_is_an_error(bad):
    with pytest.raises(ValueError):
        parse_quantity(bad)


def test_feature_gates_spellings():
    assert parse_feature_gates(["flowControl"]) == {"flowControl": True}
    assert parse_feature_gates(["flowControl=false", "x=T"]) == {"flowControl": False, "x": True}
    with pytest.raises(ValueError, match="not true or false"):
        parse_feature_gates(["flowControl=maybe"])


BASE = {"plugins": [{"type": "queue-scorer"}]}


def test_gate_on_adds_the_default_policies_and_builds_a_controller():
    cfg = load_config({**BASE, "featureGates": ["flowControl"], "flowControl": {"defaultRequestTTL": "5s"}})
    names = [p.name for p in cfg.plugins]
    assert "fcfs-ordering-policy" in names and "global-strict-fairness-policy" in names
    built = build_plugins(cfg)
    fc = build_flow_controller(cfg, built.plugins, [])
    assert fc is not None and fc.spec.request_ttl() == 5.0


def test_without_the_gate_there_is_no_controller_and_the_section_is_only_warned_about(caplog):
    cfg = load_config({**BASE, "flowControl": {"maxRequests": 10}})
    assert build_flow_controller(cfg, build_plugins(cfg).plugins, []) is None
    assert "feature gate is off" in caplog.text
    assert "fcfs-ordering-policy" not in [p.name for p in cfg.plugins]
    off = load_config({**BASE, "featureGates": ["flowControl=false"], "flowControl": {"maxRequests": 10}})
    assert build_flow_controller(off, build_plugins(off).plugins, []) is None


@pytest.mark.parametrize(
    "fc,message",
    [
        ({"priorityBands": [{"priority": 1, "orderingPolicyRef": "edf-ordering-policy"}]},
         "priorityBands[0].orderingPolicyRef: 'edf-ordering-policy' names no plugin"),
        ({"priorityBands": [{"priority": 1, "fairnessPolicyRef": "queue-scorer"}]}, "is not a fairness policy"),
        ({"priorityBands": [{"priority": 1}, {"priority": 1}]}, "priority 1 is configured more than once"),
        ({"maxBytes": "1 GB"}, "invalid quantity"),
        ({"defaultRequestTTL": 30}, "a duration is a string"),
        ({"usageLimitPolicyPluginRef": "x"}, "usageLimitPolicyPluginRef: 'x' names no plugin"),
        ({"enableEviction": True}, "in-flight eviction is not implemented"),
        ({"saturationDetector": {"pluginRef": "queue-scorer"}}, "is not a saturation detector"),
        ({"queueTTL": "1s"}, "flowControl.queueTTL: unknown field"),
    ],
)  # fmt: skip
def test_flow_control_config_errors_name_the_field(fc, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]").replace(".", r"\.")):
        load_config({**BASE, "featureGates": ["flowControl"], "flowControl": fc})


def test_a_malformed_gate_is_a_config_error():
    with pytest.raises(ConfigError, match="featureGates"):
        load_config({**BASE, "featureGates": ["flowControl=yes please"]})


# ---- policies ---------------------------------------------------------------------------------
def test_fcfs_and_edf_keys():
    a = FlowItem("a", enqueue_time=1.0, ttl=10.0)
    b = FlowItem("b", enqueue_time=2.0, ttl=1.0)
    c = FlowItem("c", enqueue_time=0.5, ttl=0.0)  # no deadline
    fcfs, edf = FCFSOrderingPolicy(), EDFOrderingPolicy()
    assert sorted("abc", key=lambda r: fcfs.key({"a": a, "b": b, "c": c}[r])) == ["c", "a", "b"]
    assert sorted("abc", key=lambda r: edf.key({"a": a, "b": b, "c": c}[r])) == ["b", "a", "c"]


def _queues(heads: dict[str, float]) -> list[FlowQueue]:
    out = []
    for seq, (fid, t) in enumerate(heads.items()):
        q = FlowQueue(fid, FCFSOrderingPolicy().key)
        q.push(FlowItem(fid, fairness_id=fid, enqueue_time=t, seq=seq))
        out.append(q)
    return out


def test_global_strict_takes_the_best_head_across_flows():
    flows = _queues({"x": 3.0, "y": 1.0, "z": 2.0})
    assert GlobalStrictFairnessPolicy().pick(flows, {}).fairness_id == "y"


def test_round_robin_cycles_in_id_order_and_skips_absent_flows():
    rr, state = RoundRobinFairnessPolicy(), {}
    flows = _queues({"b": 0.0, "a": 0.0, "c": 0.0})
    assert [rr.pick(flows, state).fairness_id for _ in range(4)] == ["a", "b", "c", "a"]
    assert rr.pick(_queues({"a": 0.0, "c": 0.0}), state).fairness_id == "c"  # b has nothing waiting


# ---- the queue --------------------------------------------------------------------------------
def test_saturated_pool_queues_and_dispatches_when_it_opens():
    fc, gate, clock, out = controller()
    assert fc.enqueue(item("r1", out)) is None
    assert fc.pump(EPS) == 0 and fc.size == 1 and out == []
    gate.saturated = False
    clock.t = 0.25
    assert fc.pump(EPS) == 1
    assert out[0].outcome is Outcome.DISPATCHED and out[0].queued_s == 0.25 and fc.size == 0


def test_bands_strictly_by_priority_then_fcfs():
    fc, gate, clock, out = controller()
    for rid, prio in [("s1", -1), ("c1", 1), ("s2", -1), ("n1", 0), ("c2", 1)]:
        clock.t += 0.01
        fc.enqueue(item(rid, out, prio))
    assert drain(fc, gate, out) == ["c1", "c2", "n1", "s1", "s2"]


@pytest.mark.parametrize(
    "fairness,expected",
    [("global-strict-fairness-policy", ["a1", "a2", "a3", "a4", "b1", "b2"]),
     ("round-robin-fairness-policy", ["a1", "b1", "a2", "b2", "a3", "a4"])],
)  # fmt: skip
def test_fairness_between_flows_of_a_band(fairness, expected):
    fc, gate, clock, out = controller({"defaultPriorityBand": {"fairnessPolicyRef": fairness}})
    for rid in ["a1", "a2", "a3", "a4", "b1", "b2"]:  # tenant a floods first
        clock.t += 0.01
        fc.enqueue(item(rid, out, 0, rid[0]))
    assert drain(fc, gate, out) == expected


def test_negative_priorities_use_their_own_template():
    fc, *_ = controller({"defaultNegativePriorityBand": {"maxRequests": 2}, "defaultPriorityBand": {"maxRequests": 7}})
    assert fc.band(-3).max_requests == 2 and fc.band(4).max_requests == 7
    assert controller()[0].band(-1).max_requests == 5000  # the system default


@pytest.mark.parametrize(
    "spec,items,rejected",
    [
        ({"maxRequests": 2}, [(0, 1), (1, 1), (-1, 1)], [2]),  # global count, across bands
        ({"maxBytes": 25}, [(0, 10), (0, 10), (1, 10)], [2]),  # global bytes
        ({"priorityBands": [{"priority": -1, "maxRequests": 1}]}, [(-1, 1), (-1, 1), (0, 1)], [1]),  # band count
        ({"priorityBands": [{"priority": 0, "maxBytes": "15"}]}, [(0, 10), (1, 10), (0, 10)], [2]),  # band bytes
    ],
)  # fmt: skip
def test_capacity_limits_reject_at_once(spec, items, rejected):
    fc, _gate, _clock, out = controller(spec)
    answers = [fc.enqueue(item(f"r{i}", out, p, size=s)) for i, (p, s) in enumerate(items)]
    assert [i for i, a in enumerate(answers) if a is Outcome.REJECTED_CAPACITY] == rejected
    assert out == []  # a rejection is answered by enqueue, not the callback


def test_ttl_evicts_the_waiting_and_a_new_regime_gets_a_fresh_budget():
    fc, _gate, clock, out = controller({"defaultRequestTTL": "2s", "noEndpointRequestTTL": "5s"})
    fc.enqueue(item("a", out))
    clock.t = 1.0
    fc.enqueue(item("b", out))
    clock.t = 1.9
    fc.pump(EPS)
    assert out == [] and fc.next_deadline() == 2.0
    clock.t = 2.0
    fc.pump(EPS)
    assert [(i.request_id, i.outcome) for i in out] == [("a", Outcome.EVICTED_TTL)]
    clock.t = 2.5
    fc.pump([])  # the pool empties: b's budget is now 5 s from here, bounded by 5 s from its enqueue
    assert fc.next_deadline() == 6.0
    clock.t = 6.0
    fc.pump([])
    assert out[1].request_id == "b" and out[1].outcome is Outcome.EVICTED_NO_ENDPOINTS


def test_ttl_zero_waits_forever():
    fc, _gate, clock, out = controller({"defaultRequestTTL": "0s"})
    fc.enqueue(item("a", out))
    clock.t = 1e6
    fc.pump(EPS)
    assert fc.size == 1 and fc.next_deadline() == math.inf


def test_cancel_leaves_at_once_and_is_never_dispatched():
    fc, gate, _clock, out = controller()
    a, b = item("a", out), item("b", out)
    fc.enqueue(a)
    fc.enqueue(b)
    assert fc.cancel(a) and a.outcome is Outcome.EVICTED_CANCELLED and fc.size == 1 and fc.bytes == 10
    assert drain(fc, gate, out) == ["b"]
    assert not fc.cancel(a)


def test_dispatch_window_holds_until_the_dispatched_are_settled():
    fc, gate, _clock, out = controller()
    for i in range(5):
        fc.enqueue(item(f"r{i}", out))
    gate.saturated = False
    assert fc.pump(EPS) == 2  # one unscheduled dispatch per endpoint
    assert fc.pump(EPS) == 0
    fc.settled(out[0])
    assert fc.pump(EPS) == 1


class Level(SaturationDetector):
    """A detector whose saturation the test sets (0.0 idle, 1.0 saturated)."""

    type_name = "test-level"

    def setup(self, handle) -> None:
        self.level = 0.0

    def is_pool_saturated(self, endpoints):
        return self.level >= 1.0

    def saturation(self, endpoints):
        return self.level


def test_dispatch_window_narrows_to_one_near_saturation():
    level, out = Level(), []
    fc = FlowController(FlowControlSpec(), [level], POLICIES.__getitem__, Clock(), window=4, narrow_at=0.5)
    for i in range(12):
        fc.enqueue(item(f"r{i}", out))
    assert fc.pump(EPS) == 4  # far from the line: the whole window
    level.level = 0.6
    for dispatched in out[:4]:
        fc.settled(dispatched)
    assert fc.pump(EPS) == 1  # near it: one unseen dispatch at a time
    assert fc.pump(EPS) == 0
    fc.settled(out[4])
    assert fc.pump(EPS) == 1
    level.level = 0.2  # back off the line: wide again (one still unsettled)
    assert fc.pump(EPS) == 3
    never = FlowController(FlowControlSpec(), [level], POLICIES.__getitem__, Clock(), window=4)  # narrow_at 1.0
    level.level = 0.9
    for i in range(6):
        never.enqueue(item(f"n{i}", []))
    assert never.pump(EPS) == 4


def test_queued_by_flow_reports_requests_and_bytes():
    fc, _gate, _clock, out = controller()
    fc.enqueue(item("a", out, 0, "x", 5))
    fc.enqueue(item("b", out, 0, "x", 7))
    fc.enqueue(item("c", out, -1, "y", 1))
    assert fc.queued_by_flow() == {(0, "x"): (2, 12), (-1, "y"): (1, 1)}
