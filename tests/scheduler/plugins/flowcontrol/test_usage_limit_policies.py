"""llm-d's usage-limit policies (which priority bands may dispatch at the pool's saturation): each
policy's ceilings as llm-d computes them, their parameters checked at load time, and the queue
walking the bands with them (highest first, stopping at the first band the saturation reaches)."""

from __future__ import annotations

import pytest

from scheduler import Endpoint, Metrics, load_config
from scheduler.config import build_plugins
from scheduler.config.flow_control import FlowControlSpec
from scheduler.errors import ConfigError
from scheduler.flowcontrol.controller import FlowController, build_flow_controller
from scheduler.flowcontrol.types import FlowItem, Outcome
from scheduler.interfaces import SaturationDetector
from scheduler.plugins.flowcontrol.fcfs import FCFSOrderingPolicy
from scheduler.plugins.flowcontrol.global_strict import GlobalStrictFairnessPolicy
from scheduler.plugins.flowcontrol.priority_holdback import PriorityHoldbackPolicy
from scheduler.plugins.flowcontrol.soft_reflective_ceiling import SoftReflectiveCeilingPolicy
from scheduler.plugins.flowcontrol.static_usage_limit import StaticUsageLimitPolicy


def holdback(**params) -> PriorityHoldbackPolicy:
    return PriorityHoldbackPolicy(params=PriorityHoldbackPolicy.Parameters.model_validate(params))


@pytest.mark.parametrize(
    "threshold,priorities,want",
    [(None, [1, 0, -1], [1.0, 1.0, 1.0]), (0.8, [5], [0.8]), (0.5, [2, -3], [0.5, 0.5]), (0.5, [], [])],
)  # fmt: skip
def test_static_gives_every_band_its_threshold(threshold, priorities, want):
    params = {} if threshold is None else {"threshold": threshold}
    policy = StaticUsageLimitPolicy(params=StaticUsageLimitPolicy.Parameters.model_validate(params))
    assert policy.ceilings(0.3, priorities) == want


@pytest.mark.parametrize(
    "params,priorities,want",
    [
        ({"minCeiling": 0.4, "maxCeiling": 0.9}, [3], [0.9]),  # one band: nothing to hold back for
        ({"minCeiling": 0.4}, [1, -1], [1.0, 0.4]),
        ({"minCeiling": 0.4, "maxCeiling": 0.9}, [10, 5, 0], [0.9, 0.65, 0.4]),  # rank: equal steps
        ({"minCeiling": 0.2, "domain": "rank"}, [100, 1, 0], [1.0, 0.6, 0.2]),  # rank ignores the values
        ({"minCeiling": 0.2, "domain": "value"}, [100, 1, 0], [1.0, 0.208, 0.2]),  # value follows them
        ({"minCeiling": 0.0, "domain": "value"}, [2, 2], [1.0, 1.0]),  # no spread of values
        ({"minCeiling": 0.5}, [], []),
    ],
)  # fmt: skip
def test_priority_holdback_ceilings(params, priorities, want):
    assert holdback(**params).ceilings(0.7, priorities) == pytest.approx(want)


@pytest.mark.parametrize(
    "params,message",
    [
        ({}, "minCeiling"),  # required, as in llm-d
        ({"minCeiling": 1.0}, "less than 1"),
        ({"minCeiling": 0.5, "maxCeiling": 0.5}, "strictly less than maxCeiling"),
        ({"minCeiling": 0.2, "maxCeiling": 1.5}, "less than or equal to 1"),
        ({"minCeiling": 0.2, "shape": "sigmoid"}, "linear"),
        ({"minCeiling": 0.2, "domain": "log"}, "rank"),
    ],
)  # fmt: skip
def test_priority_holdback_parameters_are_checked_at_load_time(params, message):
    doc = {"plugins": [{"type": "queue-scorer"}, {"type": "priority-holdback-policy", "parameters": params}]}
    with pytest.raises(ConfigError, match=message):
        load_config({**doc, "featureGates": ["flowControl"]})


def soft_run(saturation: float, bands: int, calls: int) -> list[list[float]]:
    policy = SoftReflectiveCeilingPolicy()
    return [policy.ceilings(saturation, list(range(bands, 0, -1))) for _ in range(calls)]


@pytest.mark.parametrize(
    "saturation,bands,want",
    [
        (0.3, 2, [[1.0, 1.0]] * 4),  # under every reflective ceiling (the lowest is 0.7)
        (0.65, 2, [[1.0, 0.0], [1.0, 1.0]] * 2),  # period round(0.65 / 0.35) = 2: open every second cycle
        (0.75, 2, [[1.0, 0.0], [1.0, 0.0], [1.0, 1.0], [1.0, 0.0]]),  # period 3
        (0.6, 2, [[1.0, 1.0]] * 4),  # period round(1.5 - 1e-9) = 1, as llm-d's guard rounds it
        (0.65, 3, [[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]] * 2),  # band 1's ceiling 0.675 is above 0.65
        (1.0, 3, [[1.0, 0.0, 0.0]] * 2),  # saturated: every lower band shut (band 0 by the queue)
        (0.6, 1, [[1.0]] * 2),
    ],
)  # fmt: skip
def test_soft_reflective_ceiling_throttles_lower_bands_by_a_shared_tick(saturation, bands, want):
    assert soft_run(saturation, bands, len(want)) == want


def test_soft_reflective_ceiling_takes_no_parameters():
    doc = {"plugins": [{"type": "queue-scorer"}, {"type": "soft-reflective-ceiling-policy", "parameters": {"x": 1}}]}
    with pytest.raises(ConfigError, match=r"parameters\.x: unknown parameter"):
        load_config(doc)


# ---- the queue with a policy -------------------------------------------------------------------
EPS = [Endpoint(name=f"pod-{i}", metrics=Metrics()) for i in range(4)]


class Level(SaturationDetector):
    """A detector whose saturation the test sets."""

    type_name = "test-level"

    def setup(self, handle) -> None:
        self.level = 0.0

    def saturation(self, endpoints):
        return self.level

    def is_pool_saturated(self, endpoints):
        return self.level >= 1.0


def queue(policy) -> tuple[FlowController, Level, list[FlowItem]]:
    level, out = Level(), []
    policies = {
        "fcfs-ordering-policy": FCFSOrderingPolicy(),
        "global-strict-fairness-policy": GlobalStrictFairnessPolicy(),
    }
    fc = FlowController(FlowControlSpec(), [level], policies.__getitem__, usage_limit=policy)
    for rid, prio in [("c1", 1), ("s1", -1), ("s2", -1), ("n1", 0)]:
        fc.enqueue(FlowItem(rid, prio, on_outcome=out.append))
    return fc, level, out


@pytest.mark.parametrize(
    "saturation,dispatched",
    [(0.2, ["c1", "n1", "s1", "s2"]), (0.5, ["c1", "n1"]), (0.75, ["c1"]), (0.95, [])],
)  # fmt: skip
def test_holdback_lets_each_band_dispatch_below_its_ceiling_only(saturation, dispatched):
    fc, level, out = queue(holdback(minCeiling=0.4, maxCeiling=0.9))  # bands 1, 0, -1: 0.9, 0.65, 0.4
    level.level = saturation
    fc.pump(EPS)
    assert [i.request_id for i in out if i.outcome is Outcome.DISPATCHED] == dispatched


def test_a_held_higher_band_holds_the_lower_ones_even_when_empty():
    policy = StaticUsageLimitPolicy(params=StaticUsageLimitPolicy.Parameters(threshold=0.5))
    fc, level, _ = queue(policy)
    level.level = 0.5  # every band's ceiling is 0.5: none dispatches, although the pool is not saturated
    assert fc.pump(EPS) == 0 and fc.size == 4
    level.level = 0.49
    assert fc.pump(EPS) == 4


def test_without_a_policy_every_band_dispatches_until_saturated():
    fc, level, _ = queue(None)
    level.level = 0.99
    assert fc.pump(EPS) == 4
    fc2, level2, _ = queue(None)
    level2.level = 1.0
    assert fc2.pump(EPS) == 0


BASE = {"plugins": [{"type": "queue-scorer"}], "featureGates": ["flowControl"]}


def test_the_default_static_policy_is_added_and_a_named_policy_is_used():
    cfg = load_config(BASE)
    assert cfg.plugin_spec("static-usage-limit-policy") is not None
    fc = build_flow_controller(cfg, build_plugins(cfg).plugins, [])
    assert isinstance(fc.usage_limit, StaticUsageLimitPolicy)
    doc = {**BASE, "plugins": [*BASE["plugins"], {"type": "priority-holdback-policy", "name": "hb",
                                                   "parameters": {"minCeiling": 0.3}}]}  # fmt: skip
    cfg = load_config({**doc, "flowControl": {"usageLimitPolicyPluginRef": "hb"}})
    fc = build_flow_controller(cfg, build_plugins(cfg).plugins, [])
    assert isinstance(fc.usage_limit, PriorityHoldbackPolicy) and fc.usage_limit.name == "hb"


@pytest.mark.parametrize(
    "ref,message",
    [("nope", "usageLimitPolicyPluginRef: 'nope' names no plugin"),
     ("queue-scorer", "plugin 'queue-scorer' (type queue-scorer) is not a usage-limit policy")],
)  # fmt: skip
def test_a_bad_usage_limit_ref_names_the_field(ref, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config({**BASE, "flowControl": {"usageLimitPolicyPluginRef": ref}})
