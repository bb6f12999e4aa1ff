"""What do idle profile actors cost a deployment whose gateway decides in the replica
(`decide_in_replica`)? The launcher no longer starts them there; this measures what they took.

    flock /work/quiet.lock chrt -o 0 .venv/bin/python -m bench.in_replica_actors --config pd --port 21650

One run, both states on the same machine one after the other: it starts what
`epp up --settings <a file with decide_in_replica: true>` starts (`EppDeployment`, simulated pods,
the gateway on Serve; no profile actor), sends requests, settles and samples every process of its
local Ray (this process's descendants: GCS, raylet, agents, workers, actors, Serve) — count, RSS and
USS by role; then it starts the profile actors the launcher started before (`start_epp_actors` with
the actors deciding: the same datastore, one actor per profile, each following the pool), sends the
same requests, settles and samples again. The difference is what the launcher saves; with
`profile_standby` on several nodes each profile had a standby too (another actor, not measured here:
one node). Prints JSON (and writes it with --out)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import httpx
import psutil


def role_of(cmdline: list[str]) -> str:
    """A Ray process's part: its `ray::` title (workers and actors), else its executable or script."""
    if not cmdline:
        return "?"
    first = cmdline[0].split(" ", 1)[0]
    if first.startswith("ray::"):
        return first
    scripts = [Path(part).name for part in cmdline[1:4] if part.endswith(".py")]
    return scripts[0] if scripts else Path(first).name


def sample() -> dict[str, Any]:
    """Every Ray process of this driver: how many, and their RSS and USS (MiB), in all and by role."""
    roles: dict[str, dict[str, float]] = {}
    for proc in psutil.Process().children(recursive=True):
        try:
            role = role_of(proc.cmdline())
            mem = proc.memory_full_info()
        except psutil.Error:
            continue
        entry = roles.setdefault(role, {"processes": 0, "rss_mib": 0.0, "uss_mib": 0.0})
        entry["processes"] += 1
        entry["rss_mib"] += mem.rss / 2**20
        entry["uss_mib"] += mem.uss / 2**20
    total = {k: sum(r[k] for r in roles.values()) for k in ("processes", "rss_mib", "uss_mib")}
    rounded = {role: {k: round(v, 1) for k, v in r.items()} for role, r in sorted(roles.items())}
    return {"total": {k: round(v, 1) for k, v in total.items()}, "roles": rounded}


def settled_sample(settle_s: float, samples: int = 3) -> dict[str, Any]:
    """After `settle_s`, the sample whose RSS total is the median of `samples` taken 1 s apart."""
    time.sleep(settle_s)
    taken = []
    for i in range(samples):
        if i:
            time.sleep(1.0)
        taken.append(sample())
    median = statistics.median_low(s["total"]["rss_mib"] for s in taken)
    return next(s for s in taken if s["total"]["rss_mib"] == median)


def send(url: str, model: str, n: int) -> None:
    with httpx.Client(base_url=url, timeout=30) as client:
        for i in range(n):
            body = {"model": model, "prompt": f"request {i} " * 20, "max_tokens": 2}
            client.post("/v1/completions", json=body).raise_for_status()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="default", help="a shipped config's name or a path (default %(default)s)")
    p.add_argument("--port", type=int, default=21650)
    p.add_argument("--pods", type=int, default=4, help="simulated pods (default %(default)s)")
    p.add_argument("--requests", type=int, default=50)
    p.add_argument("--settle", type=float, default=5.0, help="seconds before sampling (default %(default)s)")
    p.add_argument("--out", type=Path)
    args = p.parse_args()

    from serve_app.cli.launch import EppDeployment, LaunchSpec

    t0 = time.monotonic()
    dep = EppDeployment.start(
        LaunchSpec(config_path=args.config, sim_pods=args.pods, port=args.port, settings={"decide_in_replica": True})
    )
    try:
        from actors.launcher import start_epp_actors
        from scheduler import dump_config

        assert dep.actors.all_profile_actors() == [], "the launcher started profile actors"
        send(dep.url, dep.example_model(), args.requests)
        without = settled_sample(args.settle)
        # What the launcher started before: the profile actors, on the same datastore.
        before = start_epp_actors(dump_config(dep.actors.config), dep.pods, options=dep.actors.options)
        send(dep.url, dep.example_model(), args.requests)
        with_actors = settled_sample(args.settle)
        report = {
            "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
            "load_average": [round(x, 2) for x in os.getloadavg()],
            "config": args.config,
            "pods": args.pods,
            "profile_actors_before": sorted(before.profiles),
            "with_profile_actors (before)": with_actors,
            "without (now)": without,
            "saved": {k: round(with_actors["total"][k] - without["total"][k], 1) for k in without["total"]},
            "wall_s": round(time.monotonic() - t0, 1),
        }
    finally:
        dep.stop()
    text = json.dumps(report, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
