"""Simulated pods on a background thread, for synchronous code (pytest, Ray tests, scripts).

    with start_sim_pods_in_thread(4, time_scale=0.01) as sim:
        sim.pods[0].url, sim.pods[0].name, sim.pods[0].port
        sim.pods[1].stop()          # kill one pod (its port stops answering)
    # leaving the block (or sim.stop()) stops every pod and joins the thread

Ports are chosen by binding port 0 (or base_port + i when base_port is given).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

from ray_epp.simulator.config import FailureConfig, PodConfig
from ray_epp.simulator.http_server import SimCluster, SimPod

T = TypeVar("T")


class PodHandle:
    """A thread-safe handle on one pod running in the background loop."""

    def __init__(self, owner: ThreadedSimCluster, pod: SimPod) -> None:
        self._owner = owner
        self._pod = pod
        self.name = pod.name
        self.address = pod.host
        self.port = pod.port
        self.url = pod.url
        self.labels = pod.labels
        self.config = pod.cfg

    def info(self) -> dict[str, Any]:
        return {"name": self.name, "address": self.address, "port": self.port, "labels": dict(self.labels)}

    def stop(self) -> None:
        """Stop this pod's server and engine (connections to its port are then refused)."""
        self._owner._run(self._pod.stop())

    def set_failures(self, failures: FailureConfig | dict[str, Any]) -> None:
        self._owner._call(lambda: self._pod.set_failures(failures))

    def snapshot(self) -> dict[str, Any]:
        """The engine's current metrics in DESIGN.md's JSON form."""
        return self._owner._call(self._pod.engine.snapshot)

    def __repr__(self) -> str:
        return f"PodHandle({self.name!r}, {self.url!r})"


class ThreadedSimCluster:
    def __init__(
        self,
        pods: Sequence[PodConfig] | int = 1,
        *,
        time_scale: float = 1.0,
        seed: int = 0,
        host: str = "127.0.0.1",
        base_port: int = 0,
    ) -> None:
        self._cluster = SimCluster(pods, time_scale=time_scale, seed=seed, host=host, base_port=base_port)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name="sim-pods", daemon=True)
        self._stopped = False
        self.pods: list[PodHandle] = []

    def start(self, timeout: float = 30.0) -> ThreadedSimCluster:
        self._thread.start()
        try:
            self._run(self._cluster.start(), timeout)
        except BaseException:
            self._shutdown_loop()
            raise
        self.pods = [PodHandle(self, p) for p in self._cluster.pods]
        return self

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()
        self._loop.close()

    def _run(self, coro: Any, timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def _call(self, fn: Callable[[], T], timeout: float = 30.0) -> T:
        fut: Future[T] = Future()

        def run() -> None:
            try:
                fut.set_result(fn())
            except BaseException as exc:  # handed to the caller's thread
                fut.set_exception(exc)

        self._loop.call_soon_threadsafe(run)
        return fut.result(timeout)

    def _shutdown_loop(self) -> None:
        if self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def stop(self) -> None:
        """Stop every pod, then the loop and its thread. Safe to call twice."""
        if self._stopped:
            return
        self._stopped = True
        try:
            if self._loop.is_running():
                self._run(self._cluster.stop())
        finally:
            self._shutdown_loop()

    def pods_json(self) -> list[dict[str, Any]]:
        return [p.info() for p in self.pods]

    def __enter__(self) -> ThreadedSimCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __getitem__(self, i: int) -> PodHandle:
        return self.pods[i]

    def __len__(self) -> int:
        return len(self.pods)

    def __iter__(self) -> Iterator[PodHandle]:
        return iter(self.pods)


def start_sim_pods_in_thread(
    pods: Sequence[PodConfig] | int = 1,
    *,
    time_scale: float = 1.0,
    seed: int = 0,
    host: str = "127.0.0.1",
    base_port: int = 0,
    timeout: float = 30.0,
) -> ThreadedSimCluster:
    """Start pods on a background asyncio thread and return once they listen."""
    return ThreadedSimCluster(pods, time_scale=time_scale, seed=seed, host=host, base_port=base_port).start(timeout)
