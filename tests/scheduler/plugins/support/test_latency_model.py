"""The online latency model (scheduler/plugins/support/latency_model.py) and the SLO headers
(scheduler/plugins/support/slo.py)."""

from __future__ import annotations

import random

import pytest

from scheduler.errors import ErrorCode, SchedulingError
from scheduler.plugins.support.latency_model import RLS, LatencyModel
from scheduler.plugins.support.slo import parse_slo_headers, relative_headroom


@pytest.mark.parametrize(
    ("theta", "noise"),
    [([30.0, 5.0, 0.0], 0.0), ([10.0, 0.5, 40.0], 0.0), ([50.0, 2.0, 10.0], 1.0)],
)
def test_rls_recovers_a_linear_law(theta, noise):
    rng = random.Random(1)
    model = RLS(3, forgetting=1.0)
    for _ in range(400):
        x = [1.0, rng.uniform(0, 20), rng.uniform(0, 1)]
        model.update(x, sum(t * v for t, v in zip(theta, x, strict=True)) + rng.gauss(0, noise))
    tolerance = 0.01 if noise == 0 else 0.5
    assert model.theta == pytest.approx(theta, abs=tolerance * max(1.0, max(theta)))


def test_forgetting_follows_a_server_that_slows_down():
    model = RLS(2, forgetting=0.95)
    for i in range(300):
        x = [1.0, float(i % 7)]
        model.update(x, 20.0 + 3.0 * x[1] if i < 150 else 60.0 + 3.0 * x[1])
    assert model.predict([1.0, 0.0]) == pytest.approx(60.0, abs=0.5)


def test_cold_start_then_pool_prior_then_own_model():
    model = LatencyModel(2, min_samples=10)
    assert model.predict("a", [1.0, 1.0]) is None  # cold: no prediction at all
    for i in range(10):
        model.observe("a", [1.0, float(i)], 10.0 + 2.0 * i)
    assert model.warm
    # "b" has never been seen: the pool's fit answers for it.
    assert model.predict("b", [1.0, 4.0]) == pytest.approx(18.0, abs=0.1)
    for i in range(10):
        model.observe("b", [1.0, float(i)], 100.0 + 2.0 * i)
    # Now "b" answers from its own model (started from the pool's), "a" keeps its own.
    assert model.predict("b", [1.0, 4.0]) == pytest.approx(108.0, abs=2.0)
    assert model.predict("a", [1.0, 4.0]) == pytest.approx(18.0, abs=0.5)
    assert model.predict("a", [1.0, -100.0]) == 0.0  # never negative


@pytest.mark.parametrize(
    ("headers", "ttft", "tpot", "prediction"),
    [
        ({}, None, None, True),
        ({"x-slo-ttft-ms": "200"}, 200.0, None, True),
        ({"x-slo-ttft-ms": " 150.5 ", "x-slo-tpot-ms": "20"}, 150.5, 20.0, True),
        ({"x-prediction-based-scheduling": "false"}, None, None, False),
        ({"x-prediction-based-scheduling": "true", "x-slo-tpot-ms": "5"}, None, 5.0, True),
    ],
)
def test_slo_headers_parse(headers, ttft, tpot, prediction):
    targets = parse_slo_headers(headers)
    assert (targets.ttft_ms, targets.tpot_ms, targets.prediction) == (ttft, tpot, prediction)


@pytest.mark.parametrize(
    ("headers", "named"),
    [
        ({"x-slo-ttft-ms": "fast"}, "x-slo-ttft-ms"),
        ({"x-slo-ttft-ms": "-5"}, "x-slo-ttft-ms"),
        ({"x-slo-ttft-ms": "0"}, "x-slo-ttft-ms"),
        ({"x-slo-tpot-ms": "inf"}, "x-slo-tpot-ms"),
        ({"x-slo-tpot-ms": "nan"}, "x-slo-tpot-ms"),
        ({"x-prediction-based-scheduling": "maybe"}, "x-prediction-based-scheduling"),
    ],
)
def test_a_malformed_slo_header_is_a_bad_request_naming_it(headers, named):
    with pytest.raises(SchedulingError) as err:
        parse_slo_headers(headers)
    assert err.value.code == ErrorCode.BAD_REQUEST
    assert named in err.value.message


@pytest.mark.parametrize(
    ("headers", "ttft", "tpot", "expected"),
    [
        ({"x-slo-ttft-ms": "100"}, 50.0, None, 0.5),
        ({"x-slo-ttft-ms": "100"}, 150.0, 10.0, -0.5),
        ({"x-slo-ttft-ms": "100", "x-slo-tpot-ms": "20"}, 50.0, 30.0, -0.5),  # the worse target counts
        ({"x-slo-tpot-ms": "20"}, 50.0, None, None),  # TPOT not predicted yet: nothing to judge
        ({}, 50.0, 10.0, None),
    ],
)
def test_relative_headroom(headers, ttft, tpot, expected):
    assert relative_headroom(parse_slo_headers(headers), ttft, tpot) == expected
