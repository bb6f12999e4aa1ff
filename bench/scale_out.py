"""Gateway throughput as replicas and profile shards grow, and where the CPU goes.

    .venv/bin/python -m bench.scale_out [--replicas 1,2,4] [--shards 1,2] [--concurrency 32,64] [--seconds 8]

For each (replicas, shards) it brings up the product as a user does (`epp up --pods ... --replicas R
--profile-shards S`, in its own process and Ray) in front of fake workers that answer at once
(bench/fake_worker.py, ~2 KB bodies; 4 workers), and runs a closed loop from this process at each
concurrency (bench/loadgen.py). Requests carry 256 different ~2 KB prompts, so their first blocks,
hence their shards, differ. Over each measured window psutil reads the CPU time of every process
involved, grouped by role: gateway replicas, profile actors, datastore, metrics actors, metrics hub,
Serve's controller and proxy, Ray's raylet / GCS / other, the `epp up` driver, the fake workers and
this load generator. Prints a Markdown table (req/s, errors, cores per role) and writes --json.
The load average is printed with every row: the machine is shared."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
import urllib.request
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

from bench.gateway_overhead import _process
from bench.loadgen import closed_loop

# Roles by a process's command line, first match wins (Ray names worker processes ray::<Class>).
ROLES = [
    ("gateway", "ServeReplica"),
    ("profile actors", "ProfileActor"),
    ("datastore", "DatastoreActor"),
    ("metrics actors", "MetricsActor"),
    ("metrics hub", "MetricsHub"),
    ("serve controller", "ServeController"),
    ("serve proxy", "ProxyActor"),
    ("raylet", "raylet"),
    ("gcs", "gcs_server"),
    ("epp up driver", "serve_app.cli"),
]


def bodies(count: int, model: str = "fake-model") -> list[bytes]:
    """~2 KB prompts whose first blocks differ (the shard key), like bench/gateway_overhead.py's."""
    return [
        json.dumps({"model": model, "prompt": f"conversation {i:05d}: " + "x" * 1880, "max_tokens": 16}).encode()
        for i in range(count)
    ]


def role_of(proc: psutil.Process) -> str:
    try:
        cmd = " ".join(proc.cmdline())
    except psutil.Error:
        return "gone"
    for role, needle in ROLES:
        if needle in cmd:
            return role
    return "ray other"


def tree(root: psutil.Process) -> list[psutil.Process]:
    try:
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return [root]


def cpu_by_role(procs: dict[str, list[psutil.Process]]) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for fixed_role, members in procs.items():
        for p in members:
            try:
                t = p.cpu_times()
            except psutil.Error:
                continue
            out[fixed_role or role_of(p)] += t.user + t.system
    return dict(out)


def measure(url: str, epp_root: psutil.Process, workers: psutil.Process, conc: int, seconds: float) -> dict[str, Any]:
    procs = {"": tree(epp_root), "fake workers": [workers], "load generator": [psutil.Process()]}
    asyncio.run(closed_loop(f"{url}/v1/completions", bodies(256), conc, min(2.0, seconds)))  # warm-up
    before, t0, load = cpu_by_role(procs), time.perf_counter(), os.getloadavg()
    rps, errors = asyncio.run(closed_loop(f"{url}/v1/completions", bodies(256), conc, seconds))
    wall = time.perf_counter() - t0
    after = cpu_by_role(procs)
    cores = {role: (after.get(role, 0.0) - before.get(role, 0.0)) / wall for role in after}
    return {"rps": rps, "errors": errors, "load_average": load, "cores": cores}


@contextlib.contextmanager
def epp_up(cmd: list[str], url: str, log: Path, attempts: int = 3, timeout_s: float = 420) -> Iterator[Any]:
    """`epp up` until its /ready answers 200; started again (up to `attempts` times) when it exits
    first (on a loaded machine Ray's own start can time out)."""
    for attempt in range(1, attempts + 1):
        with _process(cmd, None, log) as proc:
            deadline = time.monotonic() + timeout_s
            while proc.poll() is None and time.monotonic() < deadline:
                with contextlib.suppress(OSError), urllib.request.urlopen(f"{url}/ready", timeout=2) as r:
                    if r.status == 200:
                        break
                time.sleep(0.5)
            else:
                tail = log.read_text()[-600:]
                if attempt == attempts or proc.poll() is None:
                    raise RuntimeError(f"epp up did not become ready (attempt {attempt}): {tail}")
                print(f"epp up exited early (attempt {attempt}), starting it again: {tail[-200:]}", flush=True)
                continue
            yield proc
            return


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replicas", default="1,2,4")
    ap.add_argument("--shards", default="1,2")
    ap.add_argument("--concurrency", default="32,64")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--port", type=int, default=int(os.environ.get("EPP_TEST_PORT", "24000")) + 300)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    worker_ports = [args.port + 10 + i for i in range(4)]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        pods = tmp / "pods.json"
        pods.write_text(
            json.dumps([{"name": f"w{i}", "address": "127.0.0.1", "port": p} for i, p in enumerate(worker_ports)])
        )
        worker_cmd = [sys.executable, "-m", "bench.fake_worker", "--ports", *map(str, worker_ports)]
        with _process(worker_cmd, f"http://127.0.0.1:{worker_ports[0]}/health", tmp / "workers.log") as wproc:
            workers = psutil.Process(wproc.pid)
            for replicas in map(int, args.replicas.split(",")):
                for shards in map(int, args.shards.split(",")):
                    url = f"http://127.0.0.1:{args.port}"
                    cmd = [sys.executable, "-m", "serve_app.cli", "up", "--pods", str(pods), "--port", str(args.port)]
                    cmd += ["--replicas", str(replicas), "--profile-shards", str(shards)]
                    with epp_up(cmd, url, tmp / f"epp-{replicas}-{shards}.log") as proc:
                        for conc in map(int, args.concurrency.split(",")):
                            row = {"replicas": replicas, "shards": shards, "concurrency": conc}
                            row |= measure(url, psutil.Process(proc.pid), workers, conc, args.seconds)
                            rows.append(row)
                            print(json.dumps(row), flush=True)
    roles = sorted({r for row in rows for r in row["cores"]}, key=lambda r: -max(x["cores"].get(r, 0) for x in rows))
    print("\n| replicas | shards | conc | req/s | errors | load avg | " + " | ".join(roles) + " |")
    print("|---" * (6 + len(roles)) + "|")
    for r in rows:
        cells = " | ".join(f"{r['cores'].get(role, 0):.2f}" for role in roles)
        la = r["load_average"]
        print(
            f"| {r['replicas']} | {r['shards']} | {r['concurrency']} | {r['rps']:.0f} | {r['errors']} "
            f"| {la[0]:.1f} | {cells} |"
        )
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": None}, "rows": rows}, indent=1))
    return rows


if __name__ == "__main__":
    main()
