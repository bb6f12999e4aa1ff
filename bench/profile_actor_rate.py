"""How many decisions per second one profile actor sustains, with Ray EPP's default config
(ray_epp/configs/default.yaml) at several pool sizes.

    .venv/bin/python -m bench.profile_actor_rate [--pods 8,64,512] [--seconds 6] [--concurrency 64]

The actor is the real `ProfileActor`, driven the way a gateway replica drives it: the gateway's
own `RayProfileRunner` (coalescing batcher, same-node channel) sends each request's call and then
its decision and completion events, from `--concurrency` concurrent requests in this process. Its
pool is a fixed snapshot of `--pods` endpoints with varied metrics (bench/scheduler_decision.py's
`make_endpoints`), served by a stand-in datastore that answers `watch` like the real one, so only
the profile actor's work is measured. Prompts: bench/scheduler_decision.py's workload (8 KB, 64
shared prefixes), so the prefix index holds real content.

Per size: decisions per second reached, the CPU (psutil, in cores) of the actor and of this
driver over the same window, and decisions per actor CPU-second: what one actor sustains when it
has a core to itself (on this shared 2-core machine the driver and other work take the rest).
Prints a Markdown table and writes --json if given."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import time
from pathlib import Path
from typing import Any

import psutil
import ray

from actors.profile_actor import ProfileActor
from actors.snapshot_delta import DeltaLog
from bench.scheduler_decision import Workload, make_endpoints
from scheduler import CycleState, SchedulingResult, build_plugins, dump_config, load_config, load_config_file
from serve_app.cli.launch import DEFAULT_CONFIG
from serve_app.gateway.ray_runner import RayProfileRunner


@ray.remote(num_cpus=0)
class FixedPool:
    """A datastore stand-in: one version of a fixed pool, answered as `DatastoreActor.watch_delta`
    does."""

    def __init__(self, endpoints: list) -> None:
        self._endpoints = endpoints
        self._log = DeltaLog(1)

    async def watch_delta(self, since_version: int, timeout_s: float) -> bytes:
        if since_version >= 1:
            await asyncio.sleep(timeout_s)
        return self._log.packed(since_version, 1, self._endpoints)


def pid_of(actor: Any) -> int:
    return ray.get(actor.__ray_call__.remote(lambda _self: os.getpid()))


def cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


async def drive(runner: RayProfileRunner, workload: Workload, concurrency: int, seconds: float) -> int:
    """Closed loop: each of `concurrency` requests is followed by the next as soon as it is decided."""
    done = 0
    deadline = time.perf_counter() + seconds

    async def one_client() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            request = next(workload.requests(1))
            results = await runner(["default"], request, CycleState(), None, None)
            result = results["default"]
            if result is None:
                raise RuntimeError("the profile actor failed a decision")
            decision = SchedulingResult({"default": result}, "default")
            runner.pre_request(request, decision)
            runner.response_complete(request, result.target_endpoints[0].name)
            done += 1

    await asyncio.gather(*(one_client() for _ in range(concurrency)))
    return done


def measure(pods: int, seconds: float, concurrency: int, warmup_s: float, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    ns = ray.get_runtime_context().namespace
    pool_name = f"bench-fixed-pool-{os.getpid()}-{pods}"
    pool = FixedPool.options(name=pool_name, namespace=ns).remote(make_endpoints(pods, rng))
    config = dump_config(load_config_file(DEFAULT_CONFIG))
    actor = ProfileActor.options(num_cpus=0).remote(config, "default", pool_name, ns, {"push_plugin_metrics": False})
    try:
        ray.get(actor.ready.remote(1), timeout=60)
        actor_proc, me = psutil.Process(pid_of(actor)), psutil.Process()
        workload = Workload(rng, 8192, 64)

        async def run() -> tuple[int, float, float, float]:
            runner = RayProfileRunner({"default": actor}, build_plugins(load_config(config)).body_fields)
            await drive(runner, workload, concurrency, warmup_s)  # the channel, the prefix index warm up
            a0, d0, t0 = cpu_s(actor_proc), cpu_s(me), time.perf_counter()
            n = await drive(runner, workload, concurrency, seconds)
            return n, time.perf_counter() - t0, cpu_s(actor_proc) - a0, cpu_s(me) - d0

        n, wall, actor_cpu, driver_cpu = asyncio.run(run())
    finally:
        ray.kill(actor, no_restart=True)
        ray.kill(pool, no_restart=True)
    return {
        "pods": pods,
        "decisions": n,
        "decisions_per_s": n / wall,
        "actor_cores": actor_cpu / wall,
        "driver_cores": driver_cpu / wall,
        "decisions_per_actor_cpu_s": n / actor_cpu if actor_cpu > 0 else None,
        "actor_cpu_ms_per_decision": 1000 * actor_cpu / n if n else None,
    }


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pods", default="8,64,512", help="comma-separated pool sizes")
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    try:
        load = os.getloadavg()
        rows = [measure(int(p), args.seconds, args.concurrency, args.warmup, args.seed) for p in args.pods.split(",")]
    finally:
        if started_ray:
            ray.shutdown()
    print(f"load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; concurrency {args.concurrency}")
    print("| pods | decisions/s | actor cores | driver cores | decisions per actor CPU-s | actor CPU ms/decision |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['pods']} | {r['decisions_per_s']:.0f} | {r['actor_cores']:.2f} | {r['driver_cores']:.2f} "
            f"| {r['decisions_per_actor_cpu_s'] or 0:.0f} | {r['actor_cpu_ms_per_decision'] or 0:.3f} |"
        )
    if args.json:
        args.json.write_text(json.dumps({"load_average": load, "args": vars(args) | {"json": None}, "results": rows}))
    return rows


if __name__ == "__main__":
    main()
