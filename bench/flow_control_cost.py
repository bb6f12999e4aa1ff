"""What a per-replica flow-control queue costs a gateway replica (docs/DESIGN.md, "Flow control").

1. The pass every request makes with the gate on and the pool not saturated: enqueue, the
   dispatch pass (both detectors of ray_epp/configs/priority.yaml asked over 8 endpoints), settle.
2. A queued request's dispatch: requests wait on asyncio futures in a real `FlowGate` (the
   gateway's class, with its metrics recorder) while the pool is saturated; the pool opens and one
   `pump()` dispatches them (window: one per endpoint, settled as they resume); the figure is the
   time from the pump that dispatched a request to the moment its coroutine runs again, i.e. the
   latency the queue adds on top of waiting for room.

    .venv/bin/python -m bench.flow_control_cost
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from pathlib import Path

from actors.metrics_hub import MetricsRecorder
from scheduler import Endpoint, LLMRequest, Metrics, load_config_file
from scheduler.admission import admission_detectors, pool_saturated
from scheduler.config import build_plugins
from scheduler.flowcontrol.controller import build_flow_controller
from scheduler.flowcontrol.types import FlowItem
from scheduler.interfaces import SaturationDetector
from serve_app.gateway.flow_gate import FlowGate


class Hold(SaturationDetector):
    """Saturated until the benchmark opens it."""

    type_name = "bench-hold"

    def setup(self, handle) -> None:
        self.saturated = True

    def is_pool_saturated(self, endpoints: list[Endpoint]) -> bool:
        return self.saturated


ROOT = Path(__file__).resolve().parents[1]
ENDPOINTS = [
    Endpoint(name=f"pod-{i}", metrics=Metrics(waiting_queue_size=1, kv_cache_usage_percent=0.3)) for i in range(8)
]


def controller():
    cfg = load_config_file(ROOT / "bench/configs/flow-control.yaml")
    assert cfg.flow_control is not None
    cfg.flow_control.default_request_ttl = 0.0  # no TTL: a loaded machine must not expire the measured
    built = build_plugins(cfg)
    detectors = admission_detectors(built.plugins.values())
    fc = build_flow_controller(cfg, built.plugins, detectors)
    assert fc is not None
    return fc


def fast_path(n: int = 50_000) -> tuple[float, float]:
    """(wall, CPU) microseconds per request; CPU time is what a loaded machine does not inflate."""
    fc = controller()
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(n):
        item = FlowItem(str(i), -1, "tenant", 2000, on_outcome=fc.settled)
        fc.enqueue(item)
        fc.pump(ENDPOINTS)
    return (time.perf_counter() - t0) / n * 1e6, (time.process_time() - c0) / n * 1e6


def detectors_only(n: int = 50_000) -> float:
    """CPU microseconds of the saturation check alone (what shed-only admission pays too)."""
    fc = controller()
    c0 = time.process_time()
    for _ in range(n):
        pool_saturated(fc.detectors, ENDPOINTS)
    return (time.process_time() - c0) / n * 1e6


async def queued_dispatch(n: int = 2000) -> list[float]:
    fc = controller()
    hold = Hold()
    fc.detectors.append(hold)
    gate = FlowGate(fc, lambda: ENDPOINTS, MetricsRecorder(), lambda r: "m", str)
    lags: list[float] = []

    async def one(i: int) -> None:
        req = LLMRequest(request_id=str(i), target_model="m", body={"model": "m", "prompt": "x"}, priority=-1)
        item = await gate.admit(req, None, 2000)
        lags.append(fc.clock() - item.finish_time)  # finish_time: the pass that dispatched it
        gate.settle(req)  # the next dispatch pass starts here, as after a real PreRequest

    tasks = [asyncio.create_task(one(i)) for i in range(n)]
    await asyncio.sleep(0.05)  # all queued
    hold.saturated = False
    gate.pump()
    await asyncio.gather(*tasks)
    return lags


def main() -> None:
    print(f"load average: {os.getloadavg()}")
    wall, cpu = fast_path()
    print(
        f"fast path (enqueue + dispatch pass + settle, pool not saturated): {cpu:.1f} us CPU ({wall:.1f} us wall) "
        f"per request; of which the saturation check (shed-only pays it too): {detectors_only():.1f} us CPU"
    )
    lags = sorted(asyncio.run(queued_dispatch()))
    q = statistics.quantiles(lags, n=100)
    print(
        f"queued dispatch -> coroutine resumes: p50 {1e3 * q[49]:.3f} ms, p90 {1e3 * q[89]:.3f} ms, "
        f"p99 {1e3 * q[98]:.3f} ms over {len(lags)} requests"
    )
    print(f"load average: {os.getloadavg()}")


if __name__ == "__main__":
    main()
