"""Does Ray's own memory stay flat under our call rate? Several Ray instances side by side, one per
task-event setting, each with one actor serving a steady rate of calls (every profile-actor call,
metrics report and hub push of a gateway is such a task), while the RSS of each instance's
`gcs_server`, raylet and dashboard agent is sampled. The settings run at the same time, so they
share the machine's load.

    .venv/bin/python -m bench.ray_processes_rss --minutes 20 --rate 100 --out bench/results/ray_processes_rss

Settings compared (env of each instance's Ray, `SETTINGS`): Ray's default (100,000 tasks' events
kept in the GCS), `epp up`'s cap (`RAY_task_events_max_num_task_in_gcs=10000`), that cap with the
GCS's record of dropped task attempts capped too, and task events off
(`RAY_task_events_report_interval_ms=0`). Writes <out>.json and <out>.png."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from serve_app.cli.launch import GCS_TASK_EVENTS_KEPT

SETTINGS: dict[str, dict[str, str]] = {
    "ray-default": {},
    "epp-cap-10000": {"RAY_task_events_max_num_task_in_gcs": str(GCS_TASK_EVENTS_KEPT)},
    # the cap, and the GCS's record of evicted task attempts (kept per job) capped too
    "cap-10000-dropped-10000": {
        "RAY_task_events_max_num_task_in_gcs": str(GCS_TASK_EVENTS_KEPT),
        "RAY_task_events_max_dropped_task_attempts_tracked_per_job_in_gcs": "10000",
    },
    # no worker sends task events (its TaskEventBuffer is off); `RAY_enable_task_events=0` is not
    # enough in Ray 2.60: measured, the GCS grew as with the default
    "task-events-off": {"RAY_task_events_report_interval_ms": "0"},
}
ROLES = ("gcs_server", "raylet", "DashboardAgent", "RuntimeEnvAgent", "dashboard.py", "monitor.py", "log_monitor.py")
PLOTTED = ("gcs_server", "raylet", "DashboardAgent")  # the rest is flat within 2 MiB (in the JSON)


def role_of(cmdline: list[str]) -> str | None:
    """The part of Ray a process is (the binaries by name, agents by their `ray::` title, the
    head's Python daemons by script), None for workers and anything else."""
    if not cmdline:
        return None
    first = cmdline[0].split(" ", 1)[0]
    if first.startswith("ray::"):
        name = first.removeprefix("ray::")
        return name if name in ROLES else None
    exe = Path(first).name
    if exe in ROLES:
        return exe
    scripts = [Path(part).name for part in cmdline[1:3] if part.endswith(".py")]
    return scripts[0] if scripts and scripts[0] in ROLES else None


def ray_process_rss() -> dict[str, float]:
    """RSS (MiB) of the Ray this process started (its descendants), by role."""
    out: dict[str, float] = {}
    for proc in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            role = role_of(proc.cmdline())
            if role is not None:
                out[role] = round(proc.memory_info().rss / 2**20, 1)
    return out


def child(name: str, minutes: float, rate: float, sample_every_s: float, out: Path) -> None:
    """One Ray instance with the calling environment's settings: calls at `rate`, samples RSS."""
    import ray

    # as `epp up` starts its own Ray (serve_app/cli/launch.py)
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")

    @ray.remote(num_cpus=0)
    class Echo:
        def echo(self, x: int) -> int:
            return x

    echo = Echo.remote()
    ray.get(echo.echo.remote(0))
    samples: list[dict[str, Any]] = []
    t0 = time.monotonic()
    calls = 0
    next_sample = 0.0
    batch = max(1, int(rate / 10))  # ten batches a second
    while (t := time.monotonic() - t0) < minutes * 60:
        if t >= next_sample:
            samples.append({"t": round(t, 1), "calls": calls, "rss_mb": ray_process_rss()})
            next_sample += sample_every_s
            out.write_text(json.dumps({"name": name, "samples": samples}))
        ray.get([echo.echo.remote(i) for i in range(batch)])
        calls += batch
        time.sleep(max(0.0, t0 + calls / rate - time.monotonic()))
    samples.append({"t": round(time.monotonic() - t0, 1), "calls": calls, "rss_mb": ray_process_rss()})
    out.write_text(json.dumps({"name": name, "samples": samples}))
    ray.shutdown()


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    roles = [r for r in PLOTTED if any(r in s["rss_mb"] for run in report["runs"].values() for s in run)]
    fig, axes = plt.subplots(1, len(roles), figsize=(3.3 * len(roles), 3.2), squeeze=False)
    for ax, role in zip(axes[0], roles, strict=True):
        for name, samples in report["runs"].items():
            pts = [(s["t"] / 60, s["rss_mb"][role]) for s in samples if role in s["rss_mb"]]
            if pts:
                ax.plot(*zip(*pts, strict=True), label=name, linewidth=1)
        ax.set_title(role, fontsize=9)
        ax.set_xlabel("minutes", fontsize=8)
        ax.tick_params(labelsize=7)
    axes[0][0].set_ylabel("RSS (MiB)", fontsize=8)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"Ray's processes at {report['rate']:g} actor calls/s", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    procs: dict[str, tuple[subprocess.Popen, Path]] = {}
    for i, (name, env) in enumerate(SETTINGS.items()):
        if i:
            await asyncio.sleep(args.stagger)  # Rays starting together on a loaded machine time out
        part = args.out.parent / f".{args.out.name}.{name}.json"
        cmd = [sys.executable, "-m", "bench.ray_processes_rss", "--child", name, "--minutes", str(args.minutes),
               "--rate", str(args.rate), "--sample-every", str(args.sample_every), "--part", str(part)]  # fmt: skip
        env = {"RAY_raylet_start_wait_time_s": "300", **os.environ, **env}
        procs[name] = (subprocess.Popen(cmd, env=env), part)
    load_start = os.getloadavg()
    for proc, _ in procs.values():
        await asyncio.to_thread(proc.wait)
    runs = {name: json.loads(part.read_text())["samples"] for name, (_, part) in procs.items()}
    for _, part in procs.values():
        part.unlink(missing_ok=True)
    return {"rate": args.rate, "minutes": args.minutes, "load_average_start": load_start,
            "load_average_end": os.getloadavg(), "settings": SETTINGS, "runs": runs}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.ray_processes_rss", description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=20.0)
    p.add_argument("--rate", type=float, default=100.0, help="actor calls a second, per instance")
    p.add_argument("--sample-every", type=float, default=30.0)
    p.add_argument("--stagger", type=float, default=20.0, help="seconds between the instances' starts")
    p.add_argument("--out", type=Path, default=Path("bench/results/ray_processes_rss"))
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--part", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--plot", type=Path, help="draw an earlier report (JSON) again, to <out>.png, and stop")
    a = p.parse_args(argv)
    if a.plot:
        plot(json.loads(a.plot.read_text()), a.out.with_suffix(".png"))
        return 0
    if a.child:
        child(a.child, a.minutes, a.rate, a.sample_every, a.part)
        return 0
    a.out.parent.mkdir(parents=True, exist_ok=True)
    report = asyncio.run(_run(a))
    a.out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    plot(report, a.out.with_suffix(".png"))
    for name, samples in report["runs"].items():
        first, last = samples[0], samples[-1]
        print(f"{name:16} calls {last['calls']:>8}: "
              + ", ".join(f"{r} {first['rss_mb'].get(r)} -> {last['rss_mb'].get(r)} MiB" for r in ROLES
                          if r in last["rss_mb"]))  # fmt: skip
    print(f"load average {report['load_average_start']} -> {report['load_average_end']}; wrote {a.out}.json/.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
