"""What the decision record (docs/OBSERVABILITY.md, "Why it went there") costs a sampled request's
CPU, apart from the wire: the scheduling trace its profile run builds, the record the replica
keeps (`DecisionRecorder.record`), and the pickle that carries both (the trace back from the
profile actor, the record to the decision log), against the same decision without them; and
the size of a record. An unsampled request costs one CRC32 of its id (timed too).

`Scheduler.schedule` with Ray EPP's default config over N endpoints (bench/scheduler_decision.py's
pool, workload and load feedback), the same requests decided with and without a trace in
alternating rounds (ROUNDS each), CPU time per decision (`time.thread_time_ns`).

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
from serve_app.decision_record import DecisionRecorder

ROUNDS = 5


def per_decision_us(n_endpoints: int, decisions: int, seed: int = 7) -> dict[str, list[float]]:
    rng = random.Random(seed)
    endpoints = make_endpoints(n_endpoints, rng)
    workload = Workload(rng, 8192, 64)
    sched = Scheduler.from_config(load_config_file(DEFAULT_CONFIG))
    recorder = DecisionRecorder(1.0, 1000, None, "bench")
    for req in workload.requests(200):  # warm up: the prefix index holds content
        load_feedback(sched.schedule(req, endpoints).target, endpoints, rng)
    out: dict[str, list[float]] = {"off": [], "recorded": [], "bytes": []}
    for _ in range(ROUNDS):
        for mode in ("off", "recorded"):
            total = 0
            for req in workload.requests(decisions):
                start = time.thread_time_ns()
                if mode == "off":
                    result = sched.schedule(req, endpoints)
                else:
                    trace = SchedulingTrace()
                    result = sched.schedule(req, endpoints, trace=trace)
                    recorder.record(req, result, trace)
                    wire = pickle.dumps(recorder._local.get(req.request_id)[-1], protocol=5)
                total += time.thread_time_ns() - start
                load_feedback(result.target, endpoints, rng)
            out[mode].append(total / decisions / 1000)
        out["bytes"].append(len(wire))
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
    print("| endpoints | decision, record off (median µs CPU) | with the trace and record | added | record bytes |")
    print("|---|---|---|---|---|")
    for n in (int(x) for x in a.endpoints.split(",")):
        r = per_decision_us(n, a.decisions)
        off, on = statistics.median(r["off"]), statistics.median(r["recorded"])
        spread = f"rounds {min(r['off']):.1f}-{max(r['off']):.1f} / {min(r['recorded']):.1f}-{max(r['recorded']):.1f}"
        print(f"| {n} | {off:.1f} | {on:.1f} | {on - off:+.1f} ({spread}) | {int(statistics.median(r['bytes']))} |")
    print(f"load average at end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
