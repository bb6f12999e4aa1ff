"""When a scrape is worth a report (actors/scrape_rules.py): plain rules, no I/O."""

from __future__ import annotations

from actors.scrape_rules import ReportPolicy, same_metrics
from scheduler import Metrics


def test_same_metrics_ignores_the_scrape_time():
    a = Metrics(waiting_queue_size=1, update_time=1.0)
    assert same_metrics(a, Metrics(waiting_queue_size=1, update_time=2.0))
    assert not same_metrics(a, Metrics(waiting_queue_size=2, update_time=1.0))
    assert same_metrics(None, None) and not same_metrics(a, None)


def test_report_on_change_on_heartbeat_and_after_a_lost_report():
    policy = ReportPolicy(heartbeat_s=1.0, min_report_interval_s=0.0, unhealthy_after_failures=3)
    m = Metrics(waiting_queue_size=1)
    assert policy.success_due(m, 10.0)  # nothing said yet
    policy.sent(m, 10.0)
    assert not policy.success_due(Metrics(waiting_queue_size=1), 10.5)  # unchanged, no heartbeat yet
    assert policy.success_due(Metrics(waiting_queue_size=2), 10.5)  # changed
    assert policy.success_due(Metrics(waiting_queue_size=1), 11.0)  # a heartbeat is due on the grid
    policy.lost()
    assert policy.success_due(Metrics(waiting_queue_size=1), 10.5)  # say it again


def test_failures_one_by_one_until_unhealthy_then_per_heartbeat():
    policy = ReportPolicy(heartbeat_s=1.0, min_report_interval_s=0.0, unhealthy_after_failures=3)
    policy.sent(None, 10.0)
    assert all(policy.failure_due(n, 10.2) for n in (1, 2, 3))
    assert not policy.failure_due(4, 10.3)
    assert policy.failure_due(9, 11.0)


def test_min_report_interval_holds_back_changes_but_not_heartbeats():
    policy = ReportPolicy(heartbeat_s=1.0, min_report_interval_s=0.5, unhealthy_after_failures=3)
    policy.sent(Metrics(waiting_queue_size=1), 10.0)
    assert not policy.success_due(Metrics(waiting_queue_size=2), 10.2)
    assert policy.success_due(Metrics(waiting_queue_size=2), 10.6)
