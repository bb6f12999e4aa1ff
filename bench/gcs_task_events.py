"""Ray's GCS keeps the events of the last N tasks (`RAY_task_events_max_num_task_in_gcs`, 100,000 by
default) for the dashboard and `ray list tasks`; every profile-actor call is a task, so a busy
gateway fills that store. This measures the GCS's RSS while one actor serves `--calls` calls.

    .venv/bin/python -m bench.gcs_task_events --calls 160000
    RAY_task_events_max_num_task_in_gcs=10000 .venv/bin/python -m bench.gcs_task_events --calls 160000
"""

from __future__ import annotations

import argparse
import os

import psutil


def gcs_rss_mib(session_dir: str) -> float:
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if "gcs_server" in cmdline and session_dir in cmdline:
            return proc.memory_info().rss / 2**20
    raise RuntimeError("no gcs_server of this Ray session found")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=160_000)
    parser.add_argument("--step", type=int, default=20_000)
    args = parser.parse_args(argv)
    import ray

    ctx = ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    session_dir = ctx.address_info["session_dir"]

    @ray.remote(num_cpus=0)
    class Echo:
        def echo(self, x: int) -> int:
            return x

    echo = Echo.remote()
    ray.get(echo.echo.remote(0))
    bound = os.environ.get("RAY_task_events_max_num_task_in_gcs", "100000 (Ray's default)")  # noqa: SIM112
    print(f"task events kept: {bound}; load average {os.getloadavg()}")
    print(f"calls 0: gcs_server {gcs_rss_mib(session_dir):.1f} MiB")
    for done in range(args.step, args.calls + 1, args.step):
        ray.get([echo.echo.remote(i) for i in range(args.step)])
        print(f"calls {done}: gcs_server {gcs_rss_mib(session_dir):.1f} MiB", flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
