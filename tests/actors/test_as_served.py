"""`as_served` (actors/protocol.py): a datastore snapshot's endpoints made ready for the plugins.

The datastore serves only pods whose metrics actor reported within its staleness threshold, and a
metrics actor reports on change (and a heartbeat), so an idle pod's `update_time` can be a
heartbeat old although its metrics are current. `as_served` sets it to 0 ("freshness not
tracked"): the utilization detector then judges the pool on queue and KV cache alone instead of
calling an idle pool stale, hence saturated, which would shed every sheddable request (429)."""

import json

from actors.protocol import as_served
from scheduler import Endpoint, Metrics, Scheduler, load_config

NOW = 1_750_000_000.0
HEARTBEAT_OLD = 1.0  # seconds: past the detector's default staleness threshold (200 ms)


def detector():
    cfg = {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha1",
        "kind": "EndpointPickerConfig",
        "plugins": [{"name": "detector", "type": "utilization-detector"}],
    }
    return Scheduler.from_config(load_config(json.dumps(cfg))).plugins["detector"]


def idle_pool() -> list[Endpoint]:
    """Two idle pods whose last report is a heartbeat old."""
    return [Endpoint(n, metrics=Metrics(update_time=NOW - HEARTBEAT_OLD)) for n in ("a", "b")]


def test_as_served_sets_update_time_to_0_in_place_keeps_the_report_time_and_every_other_metric():
    metrics = Metrics(waiting_queue_size=3, running_requests_size=2, kv_cache_usage_percent=0.4, update_time=NOW)
    before = metrics.to_json()
    endpoints = [Endpoint("a", metrics=metrics)]
    served = as_served(endpoints)
    assert served is endpoints and served[0].metrics is metrics  # this process's own copies, changed in place
    assert metrics.update_time == 0.0 and metrics.reported_at == NOW  # the report's time, kept aside
    assert metrics.to_json() == {**before, "update_time": 0.0}


def test_a_served_idle_pool_is_not_saturated_although_its_reports_are_a_heartbeat_old():
    d = detector()
    assert d.is_pool_saturated(idle_pool(), NOW)  # judged by the report time: stale, so saturated
    assert not d.is_pool_saturated(as_served(idle_pool()), NOW)
    assert d.saturation(as_served(idle_pool()), NOW) == 0.0
