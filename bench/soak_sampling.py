"""What the soak (bench/soak.py) samples while it runs and how it sums it up: the memory of every
process under the driver, named by its part (a Ray actor's title, a pod, Ray's own daemons), and the
sizes of the structures that could grow (prefix index, in-flight ledgers, the metrics hub's series)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

if TYPE_CHECKING:
    from bench.soak import Result, SoakConfig


class SoakSampling:
    """The sampling half of `Soak` (its base): reads the soak's deployment, results and clock, and
    appends to its `samples`."""

    cfg: SoakConfig
    dep: Any  # the EppDeployment
    t0: float
    results: list[Result]
    outstanding: int
    samples: list[dict[str, Any]]

    def sample(self) -> dict[str, Any]:
        import ray

        t = time.monotonic() - self.t0
        procs: dict[str, dict[str, Any]] = {}
        for proc in our_processes():
            with contextlib.suppress(psutil.Error):
                mem = proc.memory_full_info()
                if mem.rss == 0:  # exited (a zombie) since it was listed
                    continue
                procs[f"{process_role(proc)}[{proc.pid}]"] = {"rss_mb": mem.rss / 2**20, "uss_mb": mem.uss / 2**20}
        sizes: dict[str, Any] = {}
        actors = self.dep.actors  # every profile actor: the shards and their standbys
        labelled = [(f"{name}{suffix}", a) for group, suffix in ((actors.shards, ""), (actors.standbys, "-standby"))
                    for name, shards in group.items() for a in shards]  # fmt: skip
        with contextlib.suppress(Exception):
            infos = ray.get([a.info.remote() for _, a in labelled], timeout=10)
            for (label, _), info in zip(labelled, infos, strict=True):
                for key, n in info.get("state_sizes", {}).items():
                    sizes[f"{label}/{key}"] = n
                sizes[f"{label}/event_log"] = info.get("event_log", {}).get("kept", 0)
        with contextlib.suppress(Exception):
            for key, n in ray.get(self.dep.hub.sizes.remote(), timeout=10).items():
                sizes[f"metrics-hub/{key}"] = n
        with contextlib.suppress(Exception):
            sizes["datastore/pods"] = ray.get(self.dep.actors.datastore.debug_info.remote(), timeout=10)["pods"]
        probe = getattr(self, "probe", None)
        if probe is not None:  # --tracemalloc: the default profile's first actor (bench/soak_tracemalloc.py)
            probe.step(actors.shards["default"][0], round(t, 1), sizes)
        done = [r for r in self.results if r.t <= t]
        return {
            "t": round(t, 1),
            "sent": len(done),
            "failed": sum(1 for r in done if r.status != 200),
            "outstanding": self.outstanding,
            "processes": procs,
            "sizes": sizes,
        }

    async def sample_loop(self, seconds: float) -> None:
        end = self.t0 + seconds
        while True:
            self.samples.append(await asyncio.to_thread(self.sample))
            if time.monotonic() >= end:
                return
            await asyncio.sleep(min(self.cfg.sample_every_s, max(0.0, end - time.monotonic())))


def our_processes() -> list[psutil.Process]:
    """This driver, every process under the Ray it started (workers are the raylet's children,
    which is this driver's child), and the pods."""
    me = psutil.Process()
    with contextlib.suppress(psutil.Error):
        return [me, *me.children(recursive=True)]
    return [me]


def process_role(proc: psutil.Process) -> str:
    """A process's part: the Ray worker's title (ray::DatastoreActor, ray::ServeReplica:epp:Gateway,
    ...), a pod's name, or the executable."""
    with contextlib.suppress(psutil.Error):
        cmd = proc.cmdline()
        if proc.pid == os.getpid():
            return "driver"
        if cmd and cmd[0].startswith("ray::"):
            title = cmd[0].split(" ", 1)[0]
            if "ServeReplica:" in title:  # "ray::SERVE_REPLICA::<id>:ServeReplica:<app>:<deployment>" at start
                title = "ray::ServeReplica:" + title.split("ServeReplica:", 1)[1]
            return title.split(".", 1)[0]
        if any(part.endswith("simulator") for part in cmd) and "--config" in cmd:
            return "pod:" + Path(cmd[cmd.index("--config") + 1]).stem
        for part in cmd:
            name = Path(part).name
            if name in ("raylet", "gcs_server", "plasma_store") or name.endswith(".py"):
                return name
        return Path(cmd[0]).name if cmd else proc.name()
    return "?"


WARM_UP_S = 600.0  # growth is judged after this much of a process's life (caches and indexes fill)


def process_summary(samples: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per process: RSS at its first and last sample and its max, and, for one that lived past
    `WARM_UP_S`, its RSS then and its growth after it, per 10 minutes."""
    series: dict[str, list[tuple[float, float]]] = {}
    for s in samples:
        for key, mem in s["processes"].items():
            series.setdefault(key, []).append((s["t"], mem["rss_mb"]))
    out: dict[str, dict[str, Any]] = {}
    for key, pts in series.items():
        if key.startswith(("ray::IDLE", "ray::CoreWorker")):
            continue
        row: dict[str, Any] = {
            "first_t": pts[0][0],
            "last_t": pts[-1][0],
            "rss_start_mb": round(pts[0][1], 1),
            "rss_end_mb": round(pts[-1][1], 1),
            "rss_max_mb": round(max(v for _, v in pts), 1),
        }
        warm = next(((t, v) for t, v in pts if t >= pts[0][0] + WARM_UP_S), None)
        if warm is not None and pts[-1][0] - warm[0] >= WARM_UP_S:
            row["rss_warm_mb"] = round(warm[1], 1)
            row["growth_after_warm_up_mb_per_10min"] = round((pts[-1][1] - warm[1]) / (pts[-1][0] - warm[0]) * 600, 2)
        out[key] = row
    return out


def print_summary(report: dict[str, Any]) -> None:
    """The memory table of a report: per role, each process's RSS start, after warm-up, end, max."""
    print("process | start | after warm-up | end | max | growth after warm-up (MiB / 10 min)")
    for key, row in sorted(process_summary(report["samples"]).items()):
        print(f"{key} | {row['rss_start_mb']} | {row.get('rss_warm_mb', '')} | {row['rss_end_mb']} | "
              f"{row['rss_max_mb']} | {row.get('growth_after_warm_up_mb_per_10min', '')}")  # fmt: skip


def size_summary(samples: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    series: dict[str, list[int]] = {}
    for s in samples:
        for key, n in s["sizes"].items():
            series.setdefault(key, []).append(n)
    return {k: {"start": v[0], "end": v[-1], "max": max(v)} for k, v in series.items()}
