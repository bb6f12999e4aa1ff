"""Driver 1: the engine model behind vLLM's OpenAI HTTP surface, in real time (aiohttp).

Each `SimPod` is one aiohttp server on its own port plus an engine loop task that runs engine steps,
sleeping each step's duration times `time_scale` (0 = no sleeping; latencies are then reported in
the engine's model time only). `SimCluster` runs several pods in one asyncio loop.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import random
import socket
import time
from collections.abc import Sequence
from functools import partial
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import ValidationError

from ray_epp.simulator.audio_api import AudioApi
from ray_epp.simulator.completions_api import CompletionsApi
from ray_epp.simulator.config import FailureConfig, PodConfig
from ray_epp.simulator.engine import Engine, EngineRequest
from ray_epp.simulator.messages_api import MessagesApi
from ray_epp.simulator.metrics import PodMetrics
from ray_epp.simulator.openai_api import LoraLoadBody, validation_error
from ray_epp.simulator.openai_http import BadRequest, error_reply, json_reply, read_json_object
from ray_epp.simulator.pod_kv import PodKVEvents, reset_prefix_cache, tokenize
from ray_epp.simulator.pooling_api import PoolingApi
from ray_epp.simulator.progress_sink import ProgressSink
from ray_epp.simulator.responses_api import ResponsesApi
from ray_epp.simulator.tokens import Prompt

POD_HEADER = "x-inference-pod"
log = logging.getLogger(__name__)


class SimPod:
    """One simulated vLLM server: engine + HTTP app on host:port (port 0 = pick a free one)."""

    def __init__(
        self, cfg: PodConfig, *, time_scale: float = 1.0, seed: int = 0, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        if time_scale < 0:
            raise ValueError("time_scale must be >= 0")
        self.cfg = cfg
        self.name = cfg.name
        self.host = host
        self.port = port
        self.time_scale = time_scale
        self.engine = Engine(cfg, seed)
        self.engine.track_emitted = True
        self.metrics = PodMetrics(self.engine)
        self.failures: FailureConfig = cfg.failures
        self._frng = random.Random(f"failures:{seed}:{cfg.name}")
        self._ids = itertools.count()
        self._runner: web.AppRunner | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._t0 = 0.0
        self._vclock = 0.0
        self._ready_at = 0.0
        self.kv_events: PodKVEvents | None = None
        # The latest requests' (path, headers), newest last: what a gateway sent (trace context,
        # P/D headers), for tests and `epp sim` debugging.
        self.request_headers: collections.deque[tuple[str, dict[str, str]]] = collections.deque(maxlen=256)

    # ---- identity ---------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def labels(self) -> dict[str, str]:
        return self.cfg.all_labels()

    def info(self) -> dict[str, Any]:
        """The pod as the gateway's pod list wants it: name, address, port, labels (and kvEvents)."""
        out: dict[str, Any] = {"name": self.name, "address": self.host, "port": self.port, "labels": self.labels}
        if self.kv_events is not None:
            out["kvEvents"] = self.kv_events.info()
        return out

    def set_failures(self, failures: FailureConfig | dict[str, Any]) -> None:
        self.failures = FailureConfig.model_validate(failures) if isinstance(failures, dict) else failures

    # ---- lifecycle --------------------------------------------------------------------------
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/v1/load_lora_adapter", self._load_lora)
        app.router.add_post("/v1/unload_lora_adapter", self._unload_lora)
        app.router.add_post("/tokenize", partial(tokenize, self.engine))
        CompletionsApi(self).install(app.router)
        ResponsesApi(self).install(app.router)
        PoolingApi(self).install(app.router)
        MessagesApi(self).install(app.router)
        AudioApi(self).install(app.router)
        app.router.add_post("/reset_prefix_cache", partial(reset_prefix_cache, lambda: self.kv_events, self.engine))
        app.on_response_prepare.append(self._tag)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError:
            sock.close()
            raise
        self.port = sock.getsockname()[1]
        if self.cfg.kv_events and self.kv_events is None:
            try:
                self.kv_events = PodKVEvents(self.engine, self.host)
            except OSError:
                sock.close()
                raise
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        await web.SockSite(self._runner, sock, backlog=1024).start()
        self._t0 = loop.time()
        self._ready_at = self._t0 + self.cfg.startup_delay_s * self.time_scale
        self._task = asyncio.create_task(self._engine_loop(), name=f"engine-{self.name}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for r in [*self.engine.waiting, *self.engine.transferring, *self.engine.running]:
            if r.sink is not None:
                r.sink.finish()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.kv_events is not None:
            self.kv_events.close()
            self.kv_events = None

    # ---- engine loop ------------------------------------------------------------------------
    def _now(self) -> float:
        """Engine (model) time: wall time / time_scale, or the step clock when time_scale is 0."""
        if self.time_scale > 0:
            return (asyncio.get_running_loop().time() - self._t0) / self.time_scale
        return self._vclock

    async def _engine_loop(self) -> None:
        try:
            await self._run_engine()
        except Exception:  # a bug must not leave clients hanging: fail what is in flight, loudly
            log.exception("engine loop of %s failed", self.name)
            for r in [*self.engine.waiting, *self.engine.transferring, *self.engine.running]:
                r.sink.finish()
            raise

    async def _run_engine(self) -> None:
        eng, scale = self.engine, self.time_scale
        loop = asyncio.get_running_loop()
        while True:
            now = self._now()
            end = eng.begin_step(now)
            if self.kv_events is not None:
                self.kv_events.publish_pending()
            if end is None:
                self._wake.clear()
                timer = eng.next_timer()
                if timer is None:
                    await self._wake.wait()
                    continue
                try:
                    async with asyncio.timeout(max(0.0, (timer - now) * scale)):
                        await self._wake.wait()
                except TimeoutError:
                    pass
                if scale == 0:
                    self._vclock = max(self._vclock, timer)
                continue
            if scale > 0:
                await asyncio.sleep(max(0.0, self._t0 + end * scale - loop.time()))
            else:
                self._vclock = end
                await asyncio.sleep(0)
            finished = eng.finish_step()
            if self.kv_events is not None:
                self.kv_events.publish_pending()
            for r in eng.emitted:
                r.sink.emit(r)
            for r in finished:
                self.metrics.observe(r)
                r.sink.finish()

    # ---- helpers ----------------------------------------------------------------------------
    async def _tag(self, request: web.Request, response: web.StreamResponse) -> None:
        response.headers[POD_HEADER] = self.name
        if request.method == "POST":
            self.request_headers.append((request.path, {k.lower(): v for k, v in request.headers.items()}))

    def _starting(self) -> bool:
        return asyncio.get_running_loop().time() < self._ready_at

    def _draw_failure(self) -> str | None:
        f = self.failures
        if f.rate <= 0 or not f.types or self._frng.random() >= f.rate:
            return None
        return self._frng.choice(f.types)

    def submit(
        self, rid: str, prompt: Prompt, max_tokens: int, stream: bool, sink: ProgressSink | None = None, **options: Any
    ) -> EngineRequest:
        """Hand a request to the engine loop; its sink (`r.sink`, its own by default) reports
        progress. Every API the pod serves generates through here (`options`: the engine
        request's own)."""
        r = self.engine.new_request(rid, prompt, max_tokens, self._now(), **options)
        r.sink = sink or ProgressSink(stream)
        self.engine.add(r)
        self._wake.set()
        return r

    async def _models(self, request: web.Request) -> web.Response:
        if self._starting():
            return error_reply(503, "The server is starting up.")
        created = int(time.time())
        perm = [{"id": f"modelperm-{self.name}", "object": "model_permission", "created": created,
                 "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                 "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                 "organization": "*", "group": None, "is_blocking": False}]  # fmt: skip
        data = [{"id": self.cfg.model, "object": "model", "created": created, "owned_by": "vllm",
                 "root": self.cfg.model, "parent": None, "max_model_len": self.cfg.max_model_len,
                 "permission": perm}]  # fmt: skip
        for name, path in self.engine.adapters.items():
            data.append({"id": name, "object": "model", "created": created, "owned_by": "vllm", "root": path,
                         "parent": self.cfg.model, "max_model_len": None, "permission": perm})  # fmt: skip
        return json_reply(200, {"object": "list", "data": data})

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=503 if self._starting() else 200)

    async def _metrics(self, request: web.Request) -> web.Response:
        f = self.failures
        if f.metrics_delay_s > 0:
            await asyncio.sleep(f.metrics_delay_s)
        if self._starting():
            return error_reply(503, "The server is starting up.")
        if f.metrics_garbage_rate > 0 and self._frng.random() < f.metrics_garbage_rate:
            return web.Response(text="vllm:num_requests_running{{{ not prometheus \x00 garbage\n", status=200)
        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _lora_body(self, request: web.Request) -> LoraLoadBody | web.Response:
        """The adapter body, or the 400 to answer."""
        try:
            return LoraLoadBody.model_validate(await read_json_object(request))
        except BadRequest as exc:
            return error_reply(exc.status, exc.message, exc.param)
        except ValidationError as exc:
            return error_reply(400, *validation_error(exc))

    async def _load_lora(self, request: web.Request) -> web.Response:
        body = await self._lora_body(request)
        if isinstance(body, web.Response):
            return body
        if body.lora_name in self.engine.adapters:
            return error_reply(400, f"The lora adapter '{body.lora_name}' has already been loaded.", "lora_name")
        self.engine.adapters[body.lora_name] = body.lora_path or f"/adapters/{body.lora_name}"
        return web.Response(text=f"Success: LoRA adapter '{body.lora_name}' added successfully.")

    async def _unload_lora(self, request: web.Request) -> web.Response:
        body = await self._lora_body(request)
        if isinstance(body, web.Response):
            return body
        if body.lora_name not in self.engine.adapters:
            return error_reply(404, f"The lora adapter '{body.lora_name}' cannot be found.", "lora_name")
        if not self.engine.lora.drop(body.lora_name):
            return error_reply(400, f"The lora adapter '{body.lora_name}' is in use.", "lora_name")
        del self.engine.adapters[body.lora_name]
        return web.Response(text=f"Success: LoRA adapter '{body.lora_name}' removed successfully.")


class SimCluster:
    """Several SimPods in the current asyncio loop: `async with SimCluster(configs) as c: c.pods[0].url`."""

    def __init__(
        self,
        pods: Sequence[PodConfig] | int,
        *,
        time_scale: float = 1.0,
        seed: int = 0,
        host: str = "127.0.0.1",
        base_port: int = 0,
    ) -> None:
        configs = [PodConfig(name=f"sim-{i}") for i in range(pods)] if isinstance(pods, int) else list(pods)
        self.pods = [
            SimPod(c, time_scale=time_scale, seed=seed, host=host, port=base_port + i if base_port else 0)
            for i, c in enumerate(configs)
        ]

    async def start(self) -> None:
        try:
            for p in self.pods:
                await p.start()
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        for p in self.pods:
            await p.stop()

    async def __aenter__(self) -> SimCluster:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def pod(self, name: str) -> SimPod:
        return next(p for p in self.pods if p.name == name)

    def pods_json(self) -> list[dict[str, Any]]:
        return [p.info() for p in self.pods]
