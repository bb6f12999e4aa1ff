"""Flow control in the cluster simulation (virtual time): the benchmark router queues instead of
shedding, bands go strictly by priority, round-robin keeps a flooding tenant from crowding out a
light one, and a request that outwaits its TTL is shed (a HOLD the simulation takes back)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.flow_control import jain, max_min_shares, workload
from bench.policies.epp import SchedulerRouter
from ray_epp.simulator import HOLD, make_pod_configs, run_cluster_sim
from ray_epp.simulator.report import OK
from scheduler.flowcontrol.types import Outcome

ROOT = Path(__file__).resolve().parents[2]
SHED_ONLY = ROOT / "ray_epp/configs/priority.yaml"
FLOW = ROOT / "bench/configs/flow-control.yaml"
FLOW_STRICT = ROOT / "bench/configs/flow-control-strict.yaml"
CAPACITY_4_PODS = 115.0  # about half the 8-pod capacity in docs/BENCHMARKS.md


def run(config: Path, load: float, seconds: float = 4.0):
    labelled = workload(load * CAPACITY_4_PODS, seconds, seed=3)
    router = SchedulerRouter(config, seed=3)
    report = run_cluster_sim(make_pod_configs(4), labelled.requests, router, seed=3)
    ok = {r.request_id for r in report.results if r.status == OK}
    return router, report, labelled, ok


@pytest.fixture(scope="module")
def overload():
    return {name: run(path, 2.0) for name, path in (("shed", SHED_ONLY), ("rr", FLOW), ("strict", FLOW_STRICT))}


def test_queue_serves_what_shed_only_answers_429(overload):
    shed_router, _shed_report, labelled, shed_ok = overload["shed"]
    rr_router, rr_report, _, rr_ok = overload["rr"]
    sheddable = [rid for rid, k in labelled.kind.items() if k != "critical"]
    assert shed_router.flow is None and rr_router.flow is not None
    assert len(shed_router.shed) > 0.2 * len(sheddable)  # shed at once under 2x
    assert sum(1 for rid in sheddable if rid in rr_ok) > sum(1 for rid in sheddable if rid in shed_ok)
    critical = [rid for rid, k in labelled.kind.items() if k == "critical"]
    assert all(rid in rr_ok for rid in critical)  # the top band is never starved
    assert len(rr_report.results) == len(labelled.requests)  # every HOLD was handed back


def test_bands_strictly_by_priority_critical_waits_less(overload):
    _, report, labelled, _ = overload["rr"]
    waits = {"critical": [], "sheddable": []}
    for r in report.results:
        if r.status == OK:
            waits["critical" if labelled.kind[r.request_id] == "critical" else "sheddable"].append(r.queue_wait)
    assert max(sorted(waits["critical"])[: int(0.9 * len(waits["critical"]))]) < sorted(waits["sheddable"])[
        len(waits["sheddable"]) // 2
    ]


def test_round_robin_is_fairer_than_global_strict_under_a_flood(overload):
    def fairness(entry) -> float:
        _router, _report, labelled, ok = entry
        served = {t: sum(1 for rid in ok if labelled.kind[rid] == t) for t in ("flood", "steady")}
        demand = {t: float(sum(1 for k in labelled.kind.values() if k == t)) for t in ("flood", "steady")}
        fair = max_min_shares(sum(served.values()), demand)
        return jain([served[t] / fair[t] for t in served])

    assert fairness(overload["rr"]) > fairness(overload["strict"])
    assert fairness(overload["rr"]) >= 0.9


def test_ttl_evicts_in_virtual_time(overload):
    router, *_ = overload["rr"]
    outcomes = set(router.flow_outcomes.values())
    assert Outcome.DISPATCHED in outcomes and Outcome.EVICTED_TTL in outcomes  # 2 s TTL at 2x load
    assert router.shed == {rid for rid, o in router.flow_outcomes.items() if o is not Outcome.DISPATCHED}


def test_jain_and_max_min_shares():
    assert jain([1.0, 1.0]) == 1.0 and jain([1.0, 0.0]) == 0.5
    assert max_min_shares(3.0, {"a": 5.0, "b": 1.0}) == {"b": 1.0, "a": 2.0}


class Holder:
    """Holds every request 0.5 s, then sends it to the only pod: HOLD, poll() and next_poll()."""

    def __init__(self) -> None:
        self.held: list = []

    def route(self, request, pods, now):
        self.held.append((now + 0.5, request))
        return HOLD

    def poll(self, pods, now):
        due = [r for t, r in self.held if t <= now]
        self.held = [(t, r) for t, r in self.held if t > now]
        return [(r, pods[0].name) for r in due]

    def next_poll(self):
        return min((t for t, _ in self.held), default=float("inf"))


def test_the_simulation_takes_held_requests_back_and_counts_their_wait():
    labelled = workload(5.0, 2.0, seed=1)
    report = run_cluster_sim(make_pod_configs(1), labelled.requests, Holder(), scrape_interval=0.0)
    assert report.completed == len(labelled.requests)
    assert min(r.queue_wait for r in report.results) >= 0.5 and min(r.ttft for r in report.results) >= 0.5
