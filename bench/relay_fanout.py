"""Can one datastore keep hundreds of readers current? The datastore's CPU, with every reader
watching it ("direct") against one snapshot relay per node in between ("relay",
actors/snapshot_relay.py), in the same run.

    .venv/bin/python -m bench.relay_fanout [--pods 1000] [--readers 200] [--nodes 10] [--rate 20] [--modes direct,relay]

The real `DatastoreActor` holds `--pods` pods that no one scrapes; this driver publishes `--rate`
versions a second, each a `report_batch` with new metrics for `--changed` pods (as
bench/snapshot_fanout.py does). `--readers` readers follow the pool with the readers' own code
(`PoolFeed` + `PoolCopy`, actors/pool_feed.py: what profile actors and gateway views run), taking
at most one version per `--min-interval` (the readers' default, 25 ms), spread over
`--reader-procs` actors (a reader is a coroutine with its own connection, not a process: 200
processes do not fit this machine). Relay mode stands for `--nodes` Ray nodes: a relay per node,
each serving readers/nodes readers over the same-node channel. (All of them run on this one
machine and node, so the relays' and readers' CPU competes with the datastore's; the datastore's
own CPU is measured with psutil.)

Per mode: versions published a second, deliveries a second (all readers), the share of published
versions a reader took, and the CPU (cores) of the datastore, the relays and the readers."""

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

from actors.pool_feed import PoolFeed
from actors.snapshot_delta import PoolCopy
from actors.snapshot_relay import SnapshotRelay, relay_name
from bench.snapshot_fanout import cpu_s, publish, start_datastore


@ray.remote(num_cpus=0)
class Readers:
    """Many readers in one process, each following the pool through its own `PoolFeed`."""

    def __init__(self) -> None:
        self._tasks: list[asyncio.Task] = []
        self._pools: list[PoolCopy] = []
        self._feeds: list[PoolFeed] = []
        self.taken = 0

    async def follow(self, datastore: Any, nodes: list[str], min_interval_s: float) -> None:
        for node in nodes:
            pool, feed = PoolCopy(), PoolFeed(node_id=node)
            self._pools.append(pool)
            self._feeds.append(feed)
            self._tasks.append(
                asyncio.get_running_loop().create_task(self._read(datastore, pool, feed, min_interval_s))
            )

    async def _read(self, datastore: Any, pool: PoolCopy, feed: PoolFeed, min_interval_s: float) -> None:
        while True:
            try:
                if pool.apply(await feed.next(datastore, pool.version, 5.0)) is not None:
                    self.taken += 1
                    if min_interval_s:
                        await asyncio.sleep(min_interval_s)
            except asyncio.CancelledError:
                raise
            except Exception:  # a benchmark reader retries as the real ones do
                await asyncio.sleep(0.1)

    async def state(self) -> dict[str, Any]:
        return {
            "taken": self.taken,
            "sizes": [len(p.by_name) for p in self._pools],
            "from_relay": sum(f.source == "relay" for f in self._feeds),
        }

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for feed in self._feeds:
            await feed.close()
        self._tasks, self._pools, self._feeds, self.taken = [], [], [], 0

    def pid(self) -> int:
        return os.getpid()


def wait_until(what: str, check: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.2)


def measure(args: argparse.Namespace, mode: str, procs: list[Any], rate: float) -> dict[str, Any]:
    rng = random.Random(args.seed)
    relayed = mode == "relay"
    ds = start_datastore(args.pods, snapshot_relays=relayed, watch_timeout_s=5.0)
    name = ray.get(ds.__ray_call__.remote(lambda self: self._name))
    names = [f"pod-{i:04d}" for i in range(args.pods)]
    relays: list[Any] = []
    try:
        asyncio.run(publish(ds, names, args.pods, rate, 0.2, rng))  # every pod ready
        nodes = [f"bench-node-{i}" for i in range(args.nodes)]
        if relayed:  # one per (stand-in) node, owned here: no node to pin them to
            relays = [SnapshotRelay.options(name=relay_name(name, n), num_cpus=0).remote(ds, name) for n in nodes]
            wait_until("the relays' pool", lambda: all(i["pods"] == args.pods for i in _infos(relays)), 120)
        per_proc = [
            [nodes[(p + i * len(procs)) % len(nodes)] for i in range(args.readers // len(procs))]
            for p in range(len(procs))
        ]
        ray.get([r.follow.remote(ds, keys, args.min_interval) for r, keys in zip(procs, per_proc, strict=True)])
        wanted = sum(map(len, per_proc))
        wait_until("every reader's pool", lambda: _ready(procs, args.pods, wanted), 300)
        ds_proc = psutil.Process(ray.get(ds.__ray_call__.remote(lambda _self: os.getpid())))
        relay_procs = [psutil.Process(i["pid"]) for i in _infos(relays)]
        reader_procs = [psutil.Process(p) for p in ray.get([r.pid.remote() for r in procs])]
        taken0 = sum(s["taken"] for s in ray.get([r.state.remote() for r in procs]))
        d0, r0, w0 = cpu_s([ds_proc]), cpu_s(relay_procs), cpu_s(reader_procs)
        t0, load = time.perf_counter(), os.getloadavg()
        published = asyncio.run(publish(ds, names, args.changed, rate, args.seconds, rng))
        time.sleep(0.2)
        wall = time.perf_counter() - t0
        states = ray.get([r.state.remote() for r in procs])
        taken = sum(s["taken"] for s in states) - taken0
        row = {
            "mode": mode,
            "pods": args.pods,
            "readers": wanted,
            "nodes": args.nodes if relayed else None,
            "rate_asked": rate,
            "load_average": load,
            "published_per_s": published / wall,
            "deliveries_per_s": taken / wall,
            "taken_share": taken / wanted / max(published, 1),
            "readers_on_relay": sum(s["from_relay"] for s in states),
            "datastore_cores": (cpu_s([ds_proc]) - d0) / wall,
            "relay_cores": (cpu_s(relay_procs) - r0) / wall,
            "reader_cores": (cpu_s(reader_procs) - w0) / wall,
        }
    finally:
        ray.get([r.stop.remote() for r in procs])
        for relay in relays:
            ray.kill(relay, no_restart=True)
        ray.get(ds.shutdown.remote(), timeout=60)
        ray.kill(ds, no_restart=True)
    return row


def _infos(relays: list[Any]) -> list[dict[str, Any]]:
    return ray.get([r.info.remote() for r in relays])


def _ready(procs: list[Any], pods: int, wanted: int) -> bool:
    sizes = [n for s in ray.get([r.state.remote() for r in procs]) for n in s["sizes"]]
    return len(sizes) == wanted and all(n == pods for n in sizes)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pods", type=int, default=1000)
    ap.add_argument("--readers", type=int, default=200)
    ap.add_argument("--nodes", type=int, default=10, help="relays (one per node) in relay mode")
    ap.add_argument("--reader-procs", type=int, default=8)
    ap.add_argument("--modes", default="direct,relay")
    ap.add_argument("--rate", default="20", help="versions published a second (comma-separated: one row each)")
    ap.add_argument("--changed", type=int, default=16, help="pods changed per version")
    ap.add_argument("--min-interval", type=float, default=0.025, help="a reader's least time between versions")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    procs = [Readers.remote() for _ in range(args.reader_procs)]
    rows: list[dict[str, Any]] = []
    try:
        ray.get([r.pid.remote() for r in procs], timeout=300)
        for rate in map(float, args.rate.split(",")):
            for mode in args.modes.split(","):
                rows.append(measure(args, mode, procs, rate))
                print(json.dumps(rows[-1]), flush=True)
    finally:
        for r in procs:
            ray.kill(r, no_restart=True)
        if started:
            ray.shutdown()
    print(f"\n{args.pods} pods, {args.readers} readers, {args.changed} pods changed per version, {args.seconds:g} s")
    print(
        "| mode | load avg | asked/s | published/s | deliveries/s | share of versions a reader took "
        "| datastore cores | relays' cores | readers' cores |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        label = f"relay ({r['nodes']} nodes)" if r["mode"] == "relay" else "direct"
        print(
            f"| {label} | {r['load_average'][0]:.1f} | {r['rate_asked']:g} | {r['published_per_s']:.1f} "
            f"| {r['deliveries_per_s']:.0f} | {r['taken_share']:.2f} | {r['datastore_cores']:.2f} "
            f"| {r['relay_cores']:.2f} | {r['reader_cores']:.2f} |"
        )
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": None}, "rows": rows}, indent=1))
    return rows


if __name__ == "__main__":
    main()
