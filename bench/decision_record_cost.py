"""What the decision record (docs/OBSERVABILITY.md, "Why it went there") costs a sampled request's
CPU, apart from the wire: the scheduling trace its profile run builds, the record the replica
keeps (`DecisionRecorder.record`), and the pickle that carries both (the trace back from the
profile actor, the record to the decision log), against the same decision without them; and
the size of a record. An unsampled request costs one CRC32 of its id (timed too).

`Scheduler.schedule` with Ray EPP's default config over N endpoints (bench/scheduler_decision.py's
pool, workload and load feedback): each request decided twice on the same state, in random order,
without and with the trace and record; CPU time (`time.thread_time_ns`). The per-request
difference cancels the load of a shared machine better than two separate passes would.

    .venv/bin/python -m bench.decision_record_cost [--endpoints 4,16,64] [--decisions 2000]
"""

from __future__ import annotations

import argparse
import os
import pickle
import random
import statistics
import time

from bench.scheduler_decision import DEFAULT_CONFIG, Workload, load_feedback, make_endpoints
from scheduler import Scheduler, load_config_file
from scheduler.trace import SchedulingTrace
from serve_app.gateway.decision_record import DecisionRecorder


def per_decision_us(n_endpoints: int, decisions: int, seed: int = 7) -> dict[str, list[float]]:
    """Each request decided twice on the same state, in random order: without a trace, and with
    the trace, the record and its pickle; then the prefix index learns it once (untimed)."""
    rng = random.Random(seed)
    endpoints = make_endpoints(n_endpoints, rng)
    workload = Workload(rng, 8192, 64)
    sched = Scheduler.from_config(load_config_file(DEFAULT_CONFIG))
    recorder = DecisionRecorder(1.0, 1000, None, "bench")
    for req in workload.requests(200):  # warm up: the prefix index holds content
        load_feedback(sched.schedule(req, endpoints).target, endpoints, rng)

    def off(req) -> tuple[int, int]:
        start = time.thread_time_ns()
        sched.schedule(req, endpoints, run_pre_request=False)
        return time.thread_time_ns() - start, 0

    def recorded(req) -> tuple[int, int]:
        start = time.thread_time_ns()
        trace = SchedulingTrace()
        result = sched.schedule(req, endpoints, trace=trace, run_pre_request=False)
        recorder.record(req, result, trace)
        wire = pickle.dumps(recorder._local.get(req.request_id)[-1], protocol=5)
        return time.thread_time_ns() - start, len(wire)

    out: dict[str, list[float]] = {"off": [], "recorded": [], "added": [], "bytes": []}
    for req in workload.requests(decisions):
        first, second = (off, recorded) if rng.random() < 0.5 else (recorded, off)
        times = {first: first(req), second: second(req)}
        out["off"].append(times[off][0] / 1000)
        out["recorded"].append(times[recorded][0] / 1000)
        out["added"].append((times[recorded][0] - times[off][0]) / 1000)
        out["bytes"].append(times[recorded][1])
        result = sched.schedule(req, endpoints)  # the decision the pool learns (untimed)
        load_feedback(result.target, endpoints, rng)
    return out


def sampling_ns(n: int = 200_000) -> float:
    recorder = DecisionRecorder(0.01, 1000, None, "bench")
    ids = [f"gw-{i}" for i in range(n)]
    start = time.thread_time_ns()
    for rid in ids:
        recorder.samples(rid)
    return (time.thread_time_ns() - start) / n


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--endpoints", default="4,16,64")
    p.add_argument("--decisions", type=int, default=2000)
    a = p.parse_args()
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"{when}; load average at start {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"an unsampled request's sampling decision: {sampling_ns():.0f} ns")
    print(
        "| endpoints | record off: median µs CPU | with the trace and record | added: median difference"
        " per request (p25 to p75) | record bytes |"
    )
    print("|---|---|---|---|---|")
    for n in (int(x) for x in a.endpoints.split(",")):
        r = per_decision_us(n, a.decisions)
        q = statistics.quantiles(r["added"], n=4)
        print(
            f"| {n} | {statistics.median(r['off']):.1f} | {statistics.median(r['recorded']):.1f} "
            f"| {statistics.median(r['added']):+.1f} ({q[0]:+.1f} to {q[2]:+.1f}) "
            f"| {int(statistics.median(r['bytes']))} |"
        )
    print(f"load average at end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
