"""CPU of the EPP's metrics path: where it goes, per process, with N simulated pods.

    .venv/bin/python -m bench.metrics_path_cpu                       # N=4 and N=8, 20 s each, busy pods
    .venv/bin/python -m bench.metrics_path_cpu --pods 4 --seconds 10 --load idle
    .venv/bin/python -m bench.metrics_path_cpu --threads             # + per-thread CPU of the Ray actors

Set-up: a local Ray (2 CPUs, no dashboard), N simulated vLLM pods on a thread of this process
(`ray_epp.simulator.start_sim_pods_in_thread`, time scale 1), and the EPP actors for them
(`actors.launcher.start_epp_actors` with the default config and default `ActorOptions`: the
metrics actor(s) scraping every pod every 50 ms, the DatastoreActor, one ProfileActor), plus what a
gateway replica runs to follow the datastore (serve_app's EndpointView, in an actor of its own). With
`--load busy` a load generator (its own process) keeps `--concurrency` non-streaming completions
in flight on every pod, so the pods' queue, batch and KV-cache use change between most scrapes —
as in the end-to-end benchmark; with `--load idle` nothing changes but the scrape time.

Measured: CPU seconds (user + system, psutil) consumed per wall second over `--seconds`, per kind
of process: the metrics actors (summed), the datastore, the profile actor(s), the gateway view(s), the sim pods' thread
(this process, by thread id), the rest of this process, the raylet, the GCS, other Ray processes
and the load generator. CPU time, not latency: it holds up while other work loads the machine.
Each run has two phases under the same load: `on` (scrapers running) and `off` (every metrics
actor stopped), so `on - off` is what scraping costs each kind (for the sim pods: rendering
/metrics). Also the scrapes, reports and datastore versions per second.

Writes bench/results/metrics_path_cpu.json (or --out) and prints a table."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
KINDS = (
    "metrics_actors",
    "datastore",
    "profile_actors",
    "gateway_view",
    "sim_pods",
    "driver_other",
    "raylet",
    "gcs",
    "ray_other",
    "loadgen",
)


# --- load: its own process ------------------------------------------------------------------------


def _loadgen(urls: list[str], model: str, concurrency: int, max_tokens: int, stop_at: float) -> None:
    import aiohttp

    async def client(session: aiohttp.ClientSession, url: str, i: int) -> None:
        n = 0
        while time.time() < stop_at:
            n += 1
            body = {"model": model, "prompt": f"client {i} request {n} " + "word " * 50, "max_tokens": max_tokens}
            try:
                async with session.post(url + "/v1/completions", json=body) as r:
                    await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"{url} answered {r.status}")
            except (aiohttp.ClientError, OSError):
                await asyncio.sleep(0.1)

    async def main() -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as s:
            await asyncio.gather(*(client(s, u, i) for u in urls for i in range(concurrency)))

    asyncio.run(main())


# --- a gateway replica's watcher: serve_app's EndpointView in an actor of its own ---------------


def _view_actor_class():
    import ray

    @ray.remote(num_cpus=0)
    class GatewayViewActor:
        """What a gateway replica runs to follow the datastore (its `watch` long-poll), alone."""

        def __init__(self, datastore) -> None:
            from serve_app.gateway.endpoint_view import EndpointView

            self.view = EndpointView(datastore)
            self.view.start()

        async def info(self) -> dict:
            await self.view.wait_first(30)
            return {"pid": os.getpid(), "version": self.view.version, "endpoints": len(self.view.endpoints)}

    return GatewayViewActor


# --- processes ------------------------------------------------------------------------------------


def _cpu(p) -> float:
    try:
        t = p.cpu_times()
        return t.user + t.system
    except Exception:  # gone
        return 0.0


def _thread_cpu(pid: int, tid: int) -> float:
    import psutil

    for t in psutil.Process(pid).threads():
        if t.id == tid:
            return t.user_time + t.system_time
    return 0.0


def _classify(
    raylet_pid: int, metrics_pids: set[int], datastore_pid: int, view_pids: set[int], loadgen_pid: int | None
) -> dict:
    """kind -> processes (without the sim thread / driver split, done separately)."""
    import psutil

    kinds: dict[str, list] = {k: [] for k in KINDS if k not in ("sim_pods", "driver_other")}
    raylet = psutil.Process(raylet_pid)
    kinds["raylet"].append(raylet)
    for p in raylet.children(recursive=True):
        cmd = " ".join(p.cmdline() or [])
        if p.pid in metrics_pids:
            kinds["metrics_actors"].append(p)
        elif p.pid == datastore_pid:
            kinds["datastore"].append(p)
        elif p.pid in view_pids:
            kinds["gateway_view"].append(p)
        elif "ray::ProfileActor" in cmd:
            kinds["profile_actors"].append(p)
        else:
            kinds["ray_other"].append(p)
    session = _session_of(" ".join(raylet.cmdline()))
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "gcs_server" in cmd and _session_of(cmd) == session:  # only our GCS
            kinds["gcs"].append(p)
    if loadgen_pid is not None:
        kinds["loadgen"].append(psutil.Process(loadgen_pid))
    return kinds


def _session_of(cmd: str) -> str | None:
    for part in cmd.split():
        if "session_" in part:
            i = part.index("session_")
            return part[i : i + 40]
    return None


class CpuMeter:
    def __init__(self, kinds: dict[str, list], sim_tid: int) -> None:
        self.kinds = kinds
        self.sim_tid = sim_tid
        self.me = os.getpid()

    def sample(self) -> dict[str, float]:
        import psutil

        out = {k: sum(_cpu(p) for p in procs) for k, procs in self.kinds.items()}
        sim = _thread_cpu(self.me, self.sim_tid)
        out["sim_pods"] = sim
        out["driver_other"] = _cpu(psutil.Process(self.me)) - sim
        return out

    def over(self, seconds: float, before=None, after=None) -> dict[str, float]:
        if before:
            before()
        a = self.sample()
        t0 = time.monotonic()
        time.sleep(seconds)
        b = self.sample()
        wall = time.monotonic() - t0
        if after:
            after()
        return {k: round((b[k] - a[k]) / wall, 4) for k in a}


def _thread_table(pid: int, seconds: float) -> list[tuple[str, float]]:
    """CPU s/s per thread (by name) of one process over `seconds`."""
    import psutil

    def snap() -> dict[int, tuple[str, float]]:
        out = {}
        for t in psutil.Process(pid).threads():
            try:
                name = Path(f"/proc/{pid}/task/{t.id}/comm").read_text().strip()
            except OSError:
                name = "?"
            out[t.id] = (name, t.user_time + t.system_time)
        return out

    a = snap()
    time.sleep(seconds)
    b = snap()
    per_name: dict[str, float] = {}
    for tid, (name, cpu) in b.items():
        per_name[name] = per_name.get(name, 0.0) + (cpu - a.get(tid, (name, 0.0))[1]) / seconds
    return sorted(((n, round(c, 4)) for n, c in per_name.items() if c > 0), key=lambda x: -x[1])


# --- one run ----------------------------------------------------------------------------------------


def run(
    n_pods: int, seconds: float, load: str, concurrency: int, max_tokens: int, threads: bool, views: int
) -> dict[str, Any]:
    import psutil
    import ray

    from actors import ActorOptions, PodSpec, start_epp_actors, stop_epp_actors
    from ray_epp.simulator import PodConfig, start_sim_pods_in_thread
    from scheduler.config.loader import read_config_file
    from serve_app.cli.launch import DEFAULT_CONFIG

    configs = [PodConfig(name=f"sim-{i}") for i in range(n_pods)]
    name = f"bench-mpc-{n_pods}-{os.getpid()}"
    loadgen = None
    view_actors: list = []
    with start_sim_pods_in_thread(configs, time_scale=1.0) as sim:
        sim_tid = sim._thread.native_id
        specs = [PodSpec(name=p.name, address=p.address, port=p.port, labels=p.labels) for p in sim.pods]
        config = read_config_file(DEFAULT_CONFIG)
        epp = start_epp_actors(config, specs, options=ActorOptions(datastore_name=name))
        try:
            handles = ray.get(epp.datastore.metrics_actors.remote())
            actors = list({h._actor_id: h for h in handles.values()}.values())  # one actor may scrape several pods
            n_actors = len(actors)
            stats = ray.get([a.stats.remote() for a in actors])
            metrics_pids = {s["pid"] for s in stats}
            datastore_pid = ray.get(epp.datastore.debug_info.remote())["pid"]
            raylet_pid = psutil.Process(next(iter(metrics_pids))).ppid()
            view_actors = [_view_actor_class().remote(epp.datastore) for _ in range(views)]
            view_pids = {i["pid"] for i in ray.get([v.info.remote() for v in view_actors])}
            if load == "busy":
                stop_at = time.time() + 3 * seconds + 60
                ctx = multiprocessing.get_context("spawn")
                load_args = ([p.url for p in sim.pods], configs[0].model, concurrency, max_tokens, stop_at)
                loadgen = ctx.Process(target=_loadgen, args=load_args, daemon=True)
                loadgen.start()
            time.sleep(3.0)  # warm up (load reaches a steady state)
            kinds = _classify(raylet_pid, metrics_pids, datastore_pid, view_pids, loadgen.pid if loadgen else None)
            meter = CpuMeter(kinds, sim_tid)

            def counters() -> dict[str, float]:
                st = ray.get([a.stats.remote() for a in actors])
                return {
                    "scrapes": sum(s["scrapes"] for s in st),
                    "reports": sum(s["reports"] for s in st),
                    "report_calls": sum(s.get("report_calls", s["reports"]) for s in st),
                    "failures": sum(s["failures"] for s in st),
                    "version": ray.get(epp.datastore.version.remote()),
                }

            c0, t0 = counters(), time.monotonic()
            on = meter.over(seconds)
            c1, wall = counters(), time.monotonic() - t0
            rates = {k: round((c1[k] - c0[k]) / wall, 1) for k in c0}
            thread_tables = {}
            if threads:
                thread_tables = {
                    "metrics_actor": _thread_table(next(iter(metrics_pids)), min(seconds, 10.0)),
                    "datastore": _thread_table(datastore_pid, min(seconds, 10.0)),
                }
            ray.get([a.stop.remote() for a in actors])
            time.sleep(1.0)
            off = meter.over(seconds / 2)
            ray.get([a.start.remote() for a in actors])
            snapshot = ray.get(epp.datastore.snapshot.remote())[1]
        finally:
            if loadgen is not None:
                loadgen.terminate()
                loadgen.join(5)
            for v in view_actors:
                ray.kill(v)
            stop_epp_actors(epp)
    return {
        "pods": n_pods,
        "load": load,
        "gateway_views": views,
        "seconds": seconds,
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "metrics_actors": n_actors,
        "rates_per_s": rates,
        "cpu_s_per_s_on": on,
        "cpu_s_per_s_off": off,
        "cpu_s_per_s_scraping": {k: round(on[k] - off[k], 4) for k in on},
        "routable_after": len(snapshot),
        "threads": thread_tables,
    }


def _print(result: dict[str, Any]) -> None:
    r = result["rates_per_s"]
    print(
        f"\nN={result['pods']} load={result['load']} {result['seconds']:g}s  loadavg {result['loadavg']}  "
        f"scrapes/s {r['scrapes']}  pod reports/s {r['reports']}  report calls/s {r['report_calls']}  "
        f"versions/s {r['version']}  failures/s {r['failures']}  metrics actors {result['metrics_actors']}"
    )
    print(f"  {'kind':16s} {'on':>8s} {'off':>8s} {'on-off':>8s}   (CPU s per wall s)")
    for k in KINDS:
        on, off = result["cpu_s_per_s_on"][k], result["cpu_s_per_s_off"][k]
        print(f"  {k:16s} {on:8.3f} {off:8.3f} {on - off:8.3f}")
    epp_kinds = ("metrics_actors", "datastore", "profile_actors", "gateway_view")
    total_on = sum(result["cpu_s_per_s_on"][k] for k in epp_kinds)
    total_sc = sum(result["cpu_s_per_s_scraping"][k] for k in (*epp_kinds, "sim_pods", "raylet", "gcs"))
    print(
        f"  EPP actors + gateway view total (on) {total_on:.3f}; "
        f"scraping's share of everything (on-off, sim pods included) {total_sc:.3f}"
    )
    for proc, rows in result["threads"].items():
        print(f"  threads of one {proc}: " + ", ".join(f"{n} {c:.3f}" for n, c in rows[:8]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--seconds", type=float, default=20.0, help="measuring time of the `on` phase")
    parser.add_argument("--load", choices=("busy", "idle"), default="busy")
    parser.add_argument("--concurrency", type=int, default=4, help="requests in flight per pod (busy)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--views", type=int, default=1, help="gateway-replica watchers (EndpointView) to run")
    parser.add_argument("--threads", action="store_true", help="+ per-thread CPU of a metrics actor, the datastore")
    parser.add_argument("--out", type=Path, default=RESULTS / "metrics_path_cpu.json")
    args = parser.parse_args(argv)

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        namespace="bench-metrics-cpu",
        _node_ip_address="127.0.0.1",
    )
    results = []
    try:
        for n in args.pods:
            result = run(n, args.seconds, args.load, args.concurrency, args.max_tokens, args.threads, args.views)
            results.append(result)
            _print(result)
    finally:
        ray.shutdown()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"argv": sys.argv[1:], "results": results}, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
