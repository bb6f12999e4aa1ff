"""What it costs the datastore to keep its watchers current, as pods and watchers grow.

    .venv/bin/python -m bench.snapshot_fanout [--pods 8,64,512,1000] [--watchers 0,1,4,16] [--rate 50] [--changed 16]

The real `DatastoreActor` holds `--pods` pods (one metrics actor for all of them, told to scrape
once an hour: the pods' metrics come from this driver instead). The driver publishes `--rate`
versions a second: each is one `report_batch` with new metrics for `--changed` pods (16: one
metrics actor's scrape round of busy pods), the pods in turn. `--watchers` readers follow the
datastore with the gateway's own `EndpointView` (serve_app/gateway/endpoint_view.py: a long-poll, then
`as_served` and a by-name map), each in its own actor, as gateway replicas and profile actors do;
a counting handle counts the snapshots each receives. Mode "full": each answer is the whole pool
(`watch`); "delta": only what changed since the watcher's version, pickled once per version for
all watchers (`watch_delta`, actors/snapshot_delta.py). 0 watchers measures the reports' own cost.

Per (pods, watchers): versions published and snapshots received a second, the pickled size of one
snapshot, the CPU (psutil, in cores) of the datastore and of the watchers together, and the
datastore's CPU per snapshot delivered (the fan-out cost that grows with pods x watchers x
versions). Prints a Markdown table and writes --json."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pickle
import random
import time
from pathlib import Path
from typing import Any

import psutil
import ray

from actors.datastore import DatastoreActor
from actors.scrape_report import ScrapeReport
from scheduler import Metrics

# The pods' address: nothing listens there (the metrics actor's single scrape fails at once).
NOWHERE = ("127.0.0.1", 9)


class CountingHandle:
    """A datastore handle that counts the `watch` answers (snapshots) its user receives."""

    def __init__(self, handle: Any) -> None:
        self._handle = handle
        self.received = 0
        self.models = handle.models
        self.relay_for = handle.relay_for
        outer = self

        class _Counted:
            def __init__(self, method: Any) -> None:
                self._method = method

            def remote(self, *args: Any) -> Any:
                return outer._counted(self._method.remote(*args))

        self.watch = _Counted(handle.watch)
        self.watch_delta = _Counted(handle.watch_delta)

    async def _counted(self, ref: Any) -> Any:
        answer = await ref
        self.received += 1
        return answer


@ray.remote(num_cpus=0)
class Watcher:
    def __init__(self) -> None:
        self._view: Any = None
        self._handle: CountingHandle | None = None

    async def follow(self, datastore: Any, deltas: bool) -> int:
        from serve_app.gateway.endpoint_view import EndpointView

        if self._view is not None:
            await self._view.stop()
        self._handle = CountingHandle(datastore)
        self._view = EndpointView(self._handle, watch_timeout_s=5.0, models_every_s=3600, deltas=deltas)
        self._view.start()
        await self._view.wait_first(30)
        return len(self._view.endpoints)

    async def received(self) -> int:
        return self._handle.received if self._handle is not None else 0

    async def stop(self) -> None:
        if self._view is not None:
            await self._view.stop()
            self._view = None

    def pid(self) -> int:
        return os.getpid()


def cpu_s(procs: list[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        t = p.cpu_times()
        total += t.user + t.system
    return total


def fresh_metrics(rng: random.Random) -> Metrics:
    return Metrics(
        waiting_queue_size=rng.randint(0, 8),
        running_requests_size=rng.randint(0, 48),
        kv_cache_usage_percent=round(rng.uniform(0.05, 0.95), 3),
        cache_block_size=16,
        cache_num_blocks=31250,
        max_active_models=4,
        update_time=time.time(),
    )


def start_datastore(pods: int, **extra: Any) -> Any:
    """The real datastore with `pods` pods that no one scrapes (`extra`: more actor options)."""
    options = {
        "datastore_name": f"bench-fanout-{os.getpid()}-{pods}",
        "max_pods_per_metrics_actor": max(pods, 1),
        "refresh_interval_s": 3600.0,
        "heartbeat_s": 3600.0,
        "models_refresh_s": 3600.0,
        "staleness_threshold_s": 3600.0,
        "unhealthy_after_failures": 1000,
        "scrape_timeout_s": 0.5,
        **extra,
    }
    specs = [{"name": f"pod-{i:04d}", "address": NOWHERE[0], "port": NOWHERE[1]} for i in range(pods)]
    ds = DatastoreActor.options(name=options["datastore_name"], num_cpus=0).remote(
        specs, options, options["datastore_name"]
    )
    ray.get(ds.ping.remote(), timeout=120)
    return ds


async def publish(ds: Any, names: list[str], changed: int, rate: float, seconds: float, rng: random.Random) -> int:
    """`rate` versions a second, each a report_batch with new metrics for `changed` pods (in turn)."""
    published = 0
    start = time.perf_counter()
    while (now := time.perf_counter()) - start < seconds:
        first = published * changed
        batch = [names[(first + i) % len(names)] for i in range(min(changed, len(names)))]
        await ds.report_batch.remote([ScrapeReport(n, fresh_metrics(rng), None, 0, 0) for n in batch])
        published += 1
        next_at = start + published / rate
        if next_at > now:
            await asyncio.sleep(next_at - time.perf_counter())
    return published


def measure(
    pods: int, watchers: list[Any], deltas: bool, changed: int, rate: float, seconds: float, seed: int
) -> dict[str, Any]:
    rng = random.Random(seed)
    ds = start_datastore(pods)
    names = [f"pod-{i:04d}" for i in range(pods)]
    try:
        asyncio.run(publish(ds, names, pods, rate, 0.2, rng))  # every pod ready
        seen = ray.get([w.follow.remote(ds, deltas) for w in watchers], timeout=120)
        if any(n != pods for n in seen):
            raise RuntimeError(f"watchers see {seen} pods, not {pods}")
        _, snapshot = ray.get(ds.snapshot.remote())
        ds_proc = psutil.Process(ray.get(ds.__ray_call__.remote(lambda _self: os.getpid())))
        w_procs = [psutil.Process(p) for p in ray.get([w.pid.remote() for w in watchers])]
        got0 = sum(ray.get([w.received.remote() for w in watchers]))
        d0, w0, t0, load = cpu_s([ds_proc]), cpu_s(w_procs), time.perf_counter(), os.getloadavg()
        published = asyncio.run(publish(ds, names, changed, rate, seconds, rng))
        time.sleep(0.2)  # the last version reaches the watchers
        wall = time.perf_counter() - t0
        ds_cpu, w_cpu = cpu_s([ds_proc]) - d0, cpu_s(w_procs) - w0
        received = sum(ray.get([w.received.remote() for w in watchers])) - got0
        ray.get([w.stop.remote() for w in watchers])
    finally:
        ray.get(ds.shutdown.remote(), timeout=60)
        ray.kill(ds, no_restart=True)
    return {
        "pods": pods,
        "watchers": len(watchers),
        "mode": "delta" if deltas else "full",
        "changed_per_version": min(changed, pods),
        "load_average": load,
        "snapshot_bytes": len(pickle.dumps(snapshot)),
        "published_per_s": published / wall,
        "received_per_s": received / wall,
        "datastore_cores": ds_cpu / wall,
        "watcher_cores": w_cpu / wall,
        "datastore_ms_per_delivery": 1000 * ds_cpu / received if received else None,
        "watcher_ms_per_snapshot": 1000 * w_cpu / received if received else None,
    }


def add_fanout_cost(rows: list[dict[str, Any]]) -> None:
    """The datastore's CPU per delivery beyond taking the reports: its cores less those of the
    0-watcher row of the same pool size (when measured), over the snapshots delivered."""
    alone = {r["pods"]: r["datastore_cores"] for r in rows if r["watchers"] == 0}
    for r in rows:
        base = alone.get(r["pods"])
        ok = base is not None and r["received_per_s"] > 0
        r["fanout_ms_per_delivery"] = 1000 * (r["datastore_cores"] - base) / r["received_per_s"] if ok else None


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pods", default="8,64,512,1000")
    ap.add_argument("--watchers", default="0,1,4,16")
    ap.add_argument("--watchers-modes", dest="modes", default="full,delta", help="full snapshots, deltas, or both")
    ap.add_argument("--changed", type=int, default=16, help="pods changed per version (one metrics actor's round)")
    ap.add_argument("--rate", type=float, default=50.0, help="versions published a second")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    counts = [int(w) for w in args.watchers.split(",")]
    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    rows: list[dict[str, Any]] = []
    watchers = [Watcher.remote() for _ in range(max(counts))]  # reused: each follows the datastore of the row
    try:
        ray.get([w.pid.remote() for w in watchers], timeout=300)
        for pods in map(int, args.pods.split(",")):
            for n in counts:
                for mode in args.modes.split(",") if n else ["full"]:  # no watcher: the reports' cost alone
                    rows.append(
                        measure(pods, watchers[:n], mode == "delta", args.changed, args.rate, args.seconds, args.seed)
                    )
                    print(json.dumps(rows[-1]), flush=True)
    finally:
        for w in watchers:
            ray.kill(w, no_restart=True)
        if started_ray:
            ray.shutdown()
    add_fanout_cost(rows)
    print(f"\npublishing {args.rate:g} versions/s, {args.changed} pods changed in each")
    print(
        "| pods | watchers | mode | load avg | full snapshot KB | published/s | delivered/s | datastore cores "
        "| datastore ms/delivery | fan-out ms/delivery | watchers' cores | watcher ms/snapshot |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['pods']} | {r['watchers']} | {r['mode'] if r['watchers'] else '-'} | {r['load_average'][0]:.1f} "
            f"| {r['snapshot_bytes'] / 1024:.1f} "
            f"| {r['published_per_s']:.0f} | {r['received_per_s']:.0f} | {r['datastore_cores']:.2f} "
            f"| {r['datastore_ms_per_delivery'] or 0:.2f} | {r['fanout_ms_per_delivery'] or 0:.2f} "
            f"| {r['watcher_cores']:.2f} "
            f"| {r['watcher_ms_per_snapshot'] or 0:.2f} |"
        )
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": None}, "rows": rows}, indent=1))
    return rows


if __name__ == "__main__":
    main()
