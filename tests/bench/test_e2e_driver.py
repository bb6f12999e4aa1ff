"""The end-to-end driver: a tiny shared-prefix workload through sglang-router (round_robin) to two
simulated pods in their own process; the records are what bench/metrics.py reads."""

import math
import subprocess
import sys

import pytest

from bench.cli import main
from bench.e2e import TARGETS, E2EDriver, _wait_ready
from bench.metrics import OK
from bench.scenarios import SCENARIOS


def test_e2e_driver_through_sglang_round_robin() -> None:
    make = TARGETS["sglang-round-robin"]
    assert make is not None
    if make(["http://127.0.0.1:1"], None, 1) is None:  # type: ignore[arg-type]
        pytest.skip("sglang-router is not installed")
    scenario = SCENARIOS["shared-prefix"]
    pods = scenario.pods()[:2]
    workload = scenario.workload(5.0, 0, 10)
    run = E2EDriver(time_scale=0.5, max_requests=10, timeout_s=30, warmup=2).run(
        "sglang-round-robin", pods, workload, 0
    )
    assert [o.request_id for o in run.outcomes] == [
        r.request_id for r in sorted(workload, key=lambda r: r.arrival_time)
    ]
    assert all(o.status == OK for o in run.outcomes), run.extra
    by_id = {r.request_id: r for r in workload}
    for o in run.outcomes:
        req = by_id[o.request_id]
        assert o.arrival == req.arrival_time
        assert o.output_tokens == req.max_tokens
        assert o.prompt_tokens > 0 and 0 <= o.cached_tokens <= o.prompt_tokens
        assert 0 < o.ttft < o.e2e and not math.isnan(o.itl) and o.itl > 0
        # model time: at least the simulated decode of every token, well under a second per token
        assert o.e2e > (o.output_tokens - 1) * o.itl * 0.9
    m = run.metrics
    assert m["requests"] == m["completed"] == 10 and m["errors"] == 0
    assert m["time_scale"] == 0.5 and m["ttft_ms"]["p50"] > 0 and m["output_throughput"] > 0


def test_a_target_that_exits_is_reported_not_waited_for() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    with pytest.raises(RuntimeError, match="exited with 0"):
        _wait_ready(proc, "http://127.0.0.1:1/health", 30)


def test_cli_rejects_an_unknown_e2e_target(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["shared-prefix", "--driver", "e2e", "--policies", "round-robin"]) == 2
    assert "unknown e2e target 'round-robin'" in capsys.readouterr().err
