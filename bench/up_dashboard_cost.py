"""What Ray's dashboard costs `epp up`: the time from the command to "Ray EPP is up", the memory of
every process of its process tree (PSS and RSS, summed) once up, and the CPU that tree uses while
idle for a few seconds, with `--dashboard` and `--no-dashboard`, alternating; medians of the runs.

    python -m bench.up_dashboard_cost [--runs 3] [--idle 10] [--port 18700]

Each run is a fresh `epp up` (its own local Ray, 4 simulated pods), stopped with Ctrl-C."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import time

import psutil

UP_LINE = "Ray EPP is up"


def tree(pid: int) -> list[psutil.Process]:
    """The process and its descendants: a local Ray's GCS, raylet and dashboard are the driver's
    children, its workers and agents the raylet's."""
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def memory_mib(procs: list[psutil.Process]) -> tuple[float, float]:
    """(RSS, PSS) summed, MiB. RSS counts the libraries every Ray process maps once per process;
    PSS shares them out, so its sum is what the tree really holds."""
    rss = pss = 0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            info = p.memory_full_info()
            rss += info.rss
            pss += info.pss
    return rss / 2**20, pss / 2**20


def cpu_s(procs: list[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def one_run(dashboard: bool, idle_s: float, port: int) -> dict[str, float]:
    flag = "--dashboard" if dashboard else "--no-dashboard"
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "serve_app.cli", "up", flag, "--port", str(port), "--proxy-port", str(port + 1)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        for line in proc.stdout:
            if line.startswith(UP_LINE):
                break
        else:
            raise RuntimeError(f"epp up {flag} did not come up: {proc.communicate()[0][-3000:]}")
        up_s = time.monotonic() - started
        time.sleep(2.0)  # settle: the dashboard's modules finish starting
        procs = tree(proc.pid)
        before = cpu_s(procs)
        time.sleep(idle_s)
        idle_cpu = (cpu_s(procs) - before) / idle_s
        rss, pss = memory_mib(procs)
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=120)
        return {"up_s": up_s, "rss_mib": rss, "pss_mib": pss, "idle_cpu": idle_cpu}
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--idle", type=float, default=10.0, help="seconds of idle CPU measured per run")
    ap.add_argument("--port", type=int, default=18700)
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}", flush=True)
    rows: dict[bool, list[dict[str, float]]] = {True: [], False: []}
    for _ in range(args.runs):
        for dashboard in (True, False):
            rows[dashboard].append(one_run(dashboard, args.idle, args.port))
            print(f"  dashboard={dashboard}: {rows[dashboard][-1]}", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f}")
    print("| epp up | start to 'up' s | PSS of its processes MiB | RSS summed MiB | idle CPU, cores |")
    print("|---|---:|---:|---:|---:|")
    for dashboard in (True, False):
        r = rows[dashboard]
        print(
            f"| {'--dashboard' if dashboard else '--no-dashboard'} | {statistics.median(x['up_s'] for x in r):.1f} | "
            f"{statistics.median(x['pss_mib'] for x in r):.0f} | {statistics.median(x['rss_mib'] for x in r):.0f} | "
            f"{statistics.median(x['idle_cpu'] for x in r):.3f} |"
        )


if __name__ == "__main__":
    main()
