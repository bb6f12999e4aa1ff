"""utilization-filter: llm-d's cases (llm-d/llm-d-router pkg/epp/framework/plugins/scheduling/filter/
utilization/filter_test.go) as a table over scraped metrics and requests counted in flight."""

from __future__ import annotations

import pytest

from scheduler import Scheduler, SchedulingError
from scheduler.config import load_config
from scheduler.errors import ConfigError
from scheduler.plugins.filters.utilization_filter import UtilizationFilter
from tests.scheduler.helpers import endpoint, fresh_state, names, request

EPS = [
    endpoint("idle"),
    endpoint("running", running_requests_size=41),
    endpoint("queued", waiting_queue_size=1),
    endpoint("kv", kv_cache_usage_percent=0.9),
]


def build(params) -> UtilizationFilter:
    sched = Scheduler.from_config(load_config({"plugins": [{"type": "utilization-filter", "parameters": params}]}))
    return sched.plugins["utilization-filter"]


@pytest.mark.parametrize(
    ("conditions", "fallback", "want"),
    [
        ([{"metric": "running-requests", "maxValue": 40}], False, ["idle", "queued", "kv"]),
        (
            [{"metric": "running-requests", "maxValue": 41}],
            False,
            ["idle", "running", "queued", "kv"],
        ),  # at the cap: kept
        (
            [{"metric": "running-requests", "maxValue": 40}, {"metric": "waiting-queue", "maxValue": 0}],
            False,
            ["idle", "kv"],
        ),
        ([{"metric": "kv-cache-utilization", "maxValue": 0.8}], False, ["idle", "running", "queued"]),
        (
            [{"metric": "kv-cache-utilization", "maxValue": 0.0}, {"metric": "running-requests", "maxValue": 0}],
            False,
            ["idle", "queued"],
        ),
        (
            [
                {"metric": "waiting-queue", "maxValue": 0},
                {"metric": "running-requests", "maxValue": 0},
                {"metric": "kv-cache-utilization", "maxValue": 0},
            ],
            False,
            ["idle"],
        ),
    ],
)
def test_conditions(conditions, fallback, want):
    f = build({"conditions": conditions, "fallbackOnEmpty": fallback})
    assert names(f.filter(fresh_state(), request(), EPS)) == want


@pytest.mark.parametrize(("fallback", "want"), [(False, []), (True, ["running", "queued"])])
def test_fallback_on_empty(fallback, want):
    f = build(
        {
            "conditions": [{"metric": "waiting-queue", "maxValue": 0}, {"metric": "running-requests", "maxValue": 0}],
            "fallbackOnEmpty": fallback,
        }
    )
    assert names(f.filter(fresh_state(), request(), EPS[1:3])) == want


def test_active_requests_are_the_ones_this_router_sent():
    sched = Scheduler.from_config(
        load_config(
            {
                "plugins": [
                    {
                        "type": "utilization-filter",
                        "parameters": {"conditions": [{"metric": "active-requests", "maxValue": 1}]},
                    }
                ]
            }
        )
    )
    eps = [endpoint("a")]
    for i in range(2):
        sched.schedule(request(request_id=f"r{i}"), eps)
    with pytest.raises(SchedulingError):  # both requests still in flight: a is at its cap
        sched.schedule(request(request_id="r2"), eps)
    sched.response_complete(request(request_id="r0"), "a")
    assert sched.schedule(request(request_id="r3"), eps).profile_results["default"].target_endpoints[0].name == "a"


@pytest.mark.parametrize(
    ("params", "expect"),
    [
        ({"conditions": []}, "at least 1"),
        ({"conditions": [{"metric": "gpu", "maxValue": 1}]}, "metric"),
        ({"conditions": [{"metric": "waiting-queue", "maxValue": -1}]}, "greater than or equal to 0"),
        ({"conditions": [{"metric": "kv-cache-utilization", "maxValue": 2}]}, "must be at most 1"),
        ({"conditions": [{"metric": "waiting-queue"}]}, "maxValue"),
        (
            {"conditions": [{"metric": "active-requests", "maxValue": 1}], "inFlightLoadProducerName": "other"},
            "inflight-load/other",
        ),
    ],
)
def test_config_mistakes(params, expect):
    with pytest.raises(ConfigError, match=expect):
        load_config({"plugins": [{"type": "utilization-filter", "parameters": params}]})
