"""Many light simulated pods in one process: each virtual pod listens on a port of its own and
serves vLLM's `/metrics` page, `/v1/models` and an instant `/v1/completions` (and chat), so the
control plane (metrics actors, datastore, relays, profile actors, gateway) runs against 1,000
pods on one machine. The full simulator (`SimPod`: an engine per pod, continuous batching, KV
blocks) costs too much per pod for that; a farm pod has no engine: its load is a few numbers that
`drift` changes at random (`--drift-pods` pods every `--drift-s`), and a request in flight counts
as running while it is answered.

    python -m ray_epp.simulator.pod_farm --pods 500 [--host 127.0.0.1] [--drift-s 0.1] [--drift-pods 16]

prints one JSON line, {"pods": [{"name", "address", "port"}, ...]}, once every port listens, and
serves until stdin closes or it is terminated. `start_pod_farm` runs several such processes."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
BLOCK_SIZE = 16
NUM_BLOCKS = 31250


@dataclass(slots=True)
class FarmPod:
    """One virtual pod's load; `page` is its rendered /metrics text (re-rendered on change)."""

    name: str
    port: int = 0
    waiting: int = 0
    running: int = 0
    kv_usage: float = 0.0
    in_flight: int = 0
    page: bytes = field(default=b"", repr=False)

    def render(self) -> None:
        lv = f'model_name="{MODEL}",engine="0"'
        running = self.running + self.in_flight
        self.page = (
            f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{{lv}}} {running}\n"
            f"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{{{lv}}} {self.waiting}\n"
            f"# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{{{lv}}} {self.kv_usage:.4f}\n"
            "# TYPE vllm:cache_config_info gauge\n"
            f'vllm:cache_config_info{{block_size="{BLOCK_SIZE}",num_gpu_blocks="{NUM_BLOCKS}",'
            'enable_prefix_caching="True",cache_dtype="auto"} 1.0\n'
        ).encode()


class PodFarm:
    """`count` pods on `host`, ports chosen by the kernel; `drift_pods` of them change load every `drift_s`."""

    def __init__(self, count: int, host: str = "127.0.0.1", drift_s: float = 0.1, drift_pods: int = 16, seed: int = 0):
        self.host = host
        self.drift_s, self.drift_pods = drift_s, drift_pods
        self.rng = random.Random(seed)
        self.pods = [FarmPod(f"farm-{seed}-{i:04d}") for i in range(count)]
        self.by_port: dict[int, FarmPod] = {}
        self._runner: web.AppRunner | None = None
        self._drift: asyncio.Task | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/completions", self._complete)
        app.router.add_post("/v1/chat/completions", self._complete)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        for pod in self.pods:
            site = web.TCPSite(self._runner, self.host, 0)
            await site.start()
            pod.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self.by_port[pod.port] = pod
            self._change(pod)
        if self.drift_pods and self.drift_s:
            self._drift = asyncio.get_running_loop().create_task(self._drift_loop())

    def _change(self, pod: FarmPod) -> None:
        pod.waiting = int(self.rng.expovariate(1 / 2))
        pod.running = self.rng.randint(0, 32)
        pod.kv_usage = self.rng.uniform(0.05, 0.9)
        pod.render()

    async def _drift_loop(self) -> None:
        while True:
            await asyncio.sleep(self.drift_s)
            for pod in self.rng.sample(self.pods, min(self.drift_pods, len(self.pods))):
                self._change(pod)

    def _pod(self, request: web.Request) -> FarmPod:
        return self.by_port[request.transport.get_extra_info("sockname")[1]]  # type: ignore[union-attr]

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self._pod(request).page, content_type="text/plain")

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "farm"}]})

    async def _complete(self, request: web.Request) -> web.StreamResponse:
        pod = self._pod(request)
        body = await request.json()
        pod.in_flight += 1
        pod.render()
        try:
            answer = {
                "id": f"cmpl-{pod.name}-{time.monotonic_ns()}",
                "object": "text_completion",
                "model": body.get("model", MODEL),
                "choices": [{"index": 0, "text": f"served by {pod.name}", "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4},
            }
            if not body.get("stream"):
                return web.json_response(answer, headers={"x-farm-pod": pod.name})
            out = web.StreamResponse(headers={"Content-Type": "text/event-stream", "x-farm-pod": pod.name})
            await out.prepare(request)
            await out.write(f"data: {json.dumps(answer)}\n\ndata: [DONE]\n\n".encode())
            await out.write_eof()
            return out
        finally:
            pod.in_flight -= 1
            pod.render()

    def listing(self) -> list[dict[str, Any]]:
        return [{"name": p.name, "address": self.host, "port": p.port} for p in self.pods]

    async def stop(self) -> None:
        if self._drift is not None:
            self._drift.cancel()
        if self._runner is not None:
            await self._runner.cleanup()


async def _serve(args: argparse.Namespace) -> None:
    farm = PodFarm(args.pods, args.host, args.drift_s, args.drift_pods, args.seed)
    await farm.start()
    print(json.dumps({"pods": farm.listing()}), flush=True)
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, done.set)
    loop.add_reader(sys.stdin.fileno(), lambda: sys.stdin.read(1) or done.set())  # stdin closed: the parent left
    await done.wait()
    await farm.stop()


@dataclass
class FarmProcesses:
    """Pod farm processes started by `start_pod_farm`: `pods` lists every pod (name, address, port)."""

    procs: list[subprocess.Popen]
    pods: list[dict[str, Any]]

    def stop(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


@contextlib.contextmanager
def start_pod_farm(
    pods: int, processes: int = 2, host: str = "127.0.0.1", drift_s: float = 0.1, drift_pods: int = 16
) -> Iterator[FarmProcesses]:
    """`pods` farm pods over `processes` processes (named farm-<process>-<i>); stopped on exit."""
    procs: list[subprocess.Popen] = []
    farm = FarmProcesses(procs, [])
    try:
        for i in range(processes):
            share = pods // processes + (1 if i < pods % processes else 0)
            cmd = [sys.executable, "-m", "ray_epp.simulator.pod_farm", "--pods", str(share), "--host", host]
            cmd += ["--drift-s", str(drift_s), "--drift-pods", str(max(1, drift_pods // processes)), "--seed", str(i)]
            procs.append(subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
        for proc in procs:
            line = proc.stdout.readline() if proc.stdout is not None else ""
            if not line:
                raise RuntimeError(f"pod farm process exited with {proc.wait()} before listening")
            farm.pods.extend(json.loads(line)["pods"])
        yield farm
    finally:
        farm.stop()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pods", type=int, default=500)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--drift-s", type=float, default=0.1)
    ap.add_argument("--drift-pods", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    asyncio.run(_serve(ap.parse_args(argv)))


if __name__ == "__main__":
    main()
