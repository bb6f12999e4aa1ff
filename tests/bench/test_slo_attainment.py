"""The SLO-attainment benchmark (bench/slo_attainment.py) and the decision timer it relies on
with flow control (bench/drivers.py, TimedRouter)."""

from __future__ import annotations

from bench.drivers import TimedRouter
from bench.metrics import Outcome
from bench.policies import make_policy
from bench.scenarios import SCENARIOS
from bench.slo_attainment import SLO_HEADER, attainment, run, slo_workload, verdicts
from ray_epp.simulator import run_cluster_sim


def test_every_third_request_carries_the_target():
    workload = slo_workload(50.0, 0, 4.0, 80.0)
    assert [SLO_HEADER in r.headers for r in workload[:6]] == [True, False, False, True, False, False]
    assert {r.headers[SLO_HEADER] for r in workload if SLO_HEADER in r.headers} == {"80"}


def test_attainment_and_goodput_count_what_met_its_target():
    workload = slo_workload(10.0, 0, 1.0, 50.0)[:4]  # 0 and 3 carry the target
    for i, r in enumerate(workload):
        r.arrival_time = float(i)
    outcomes = [
        Outcome(workload[0].request_id, "ok", 0.0, ttft=0.040),  # met
        Outcome(workload[1].request_id, "ok", 1.0, ttft=0.500),  # no target: counts as good
        Outcome(workload[2].request_id, "error", 2.0),  # failed
        Outcome(workload[3].request_id, "ok", 3.0, ttft=0.060),  # missed
    ]
    figures = attainment(outcomes, workload, 50.0)
    assert figures["attainment"] == 0.5 and figures["slo_requests"] == 2
    assert figures["goodput_rps"] == 2 / 3


def test_a_held_request_is_timed_once_when_flow_control_releases_it():
    workload = SCENARIOS["uniform"].workload(200.0, 0, 120)
    router = TimedRouter(make_policy("epp-slo", 0))
    report = run_cluster_sim(SCENARIOS["uniform"].pods(), workload, router, scrape_interval=0.05, seed=0)
    decided = sum(1 for r in report.results if r.status == "ok")
    assert len(router.route_s) == decided == len(workload)
    assert all(t > 0 for t in router.route_s)


def test_a_short_run_reports_every_policy_and_the_verdicts():
    result = run(["epp-slo", "round-robin"], [0.5, 1.1], 1.5, 75.0, capacity=235.9, seed=0)
    assert [(r["fraction"], r["policy"]) for r in result["rows"]] == [
        (0.5, "epp-slo"), (0.5, "round-robin"), (1.1, "epp-slo"), (1.1, "round-robin"),
    ]  # fmt: skip
    assert all(0.0 <= r["attainment"] <= 1.0 for r in result["rows"])
    assert any("1.1x" in line for line in verdicts(result))
