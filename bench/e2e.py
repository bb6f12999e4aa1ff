"""The end-to-end driver: a scenario's workload over HTTP through a real router to simulated pods.

For each run (one target at one rate) `E2EDriver`:

1. starts the scenario's pods (its `PodConfig`s) as simulated vLLM servers in their own process
   (`python -m ray_epp.simulator --config ... --time-scale S`), so they do not share the driver's CPU and
   every target starts with cold prefix caches;
2. starts the target (a real router process in front of those pods, see `TARGETS`), waits until it
   answers and warms it up with a few short requests (not counted; their prompts share nothing
   with the workload);
3. replays the workload: each request's body is sent at `arrival_time x S` with `stream: true` and
   `stream_options.include_usage`, so TTFT (first streamed token), ITL and E2E are measured at the
   client; `usage.prompt_tokens_details.cached_tokens` gives the prefix-cache hits; a 429 is a shed.
   With `api` other than chat, a chat request goes over the Responses API or Anthropic Messages
   (bench/api_shapes.py: a Responses turn chains to its session's previous response and waits
   for it), read back in that API's stream events and usage names;
4. stops the router and the pods.

Times in the outcomes are in the model's time (wall time / S), like the cluster simulation's, so
the rate ladder, bench/metrics.py and the report apply unchanged. A router's own overhead is
therefore magnified by 1/S when S < 1 (and shrunk when S > 1). Only 127.0.0.1; bounded by
`max_requests` (the first N arrivals) and by `timeout_s` after the last arrival."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from bench.api_shapes import SESSION_HEADER, StreamReader, api_of, chains, request
from bench.drivers import RunResult
from bench.gateway_overhead import ROOT, _bin, _process, _wait_http
from bench.metrics import ERROR, OK, SHED, Outcome, summarize
from bench.policies import config_path, is_ours
from ray_epp.simulator import PodConfig, SimRequest

PRIORITY_HEADER = "x-gateway-inference-priority"
KEEPALIVE_S = 2.0  # the client's idle connections, well under the gateway's keep_alive_timeout_s (65 s)
DROPPED_REASON_HEADER = "x-llm-d-request-dropped-reason"  # flow control's refusals carry it

# name -> (worker URLs, pods JSON path, port) -> (command, readiness URL, base URL); None when absent
TargetFn = Callable[[list[str], Path, int], tuple[list[str], str, str] | None]


def _gateway(config: str) -> TargetFn:
    def make(workers: list[str], pods_json: Path, port: int) -> tuple[list[str], str, str]:
        cmd = [sys.executable, "-m", "serve_app.cli", "up", "--pods", str(pods_json), "--port", str(port)]
        return [*cmd, "--config", str(ROOT / config)], f"http://127.0.0.1:{port}/ready", f"http://127.0.0.1:{port}"

    return make


def _sglang(policy: str) -> TargetFn:
    def make(workers: list[str], pods_json: Path, port: int) -> tuple[list[str], str, str] | None:
        sg = _bin("sglang-router")
        if sg is None:
            return None
        cmd = [sg, "launch", "--worker-urls", *workers, "--policy", policy, "--host", "127.0.0.1", "--port", str(port)]
        return cmd, f"http://127.0.0.1:{port}/health", f"http://127.0.0.1:{port}"

    return make


def _vllm_router(workers: list[str], pods_json: Path, port: int) -> tuple[list[str], str, str] | None:
    vr = _bin("vllm-router")
    if vr is None:
        return None
    cmd = [vr, "--worker-urls", *workers, "--policy", "cache_aware", "--host", "127.0.0.1", "--port", str(port)]
    return cmd, f"http://127.0.0.1:{port}/health", f"http://127.0.0.1:{port}"


def _serve_forwarder(workers: list[str], pods_json: Path, port: int) -> tuple[list[str], str, str]:
    cmd = [sys.executable, "-m", "bench.serve_forwarder", "--port", str(port), "--workers", *workers]
    return cmd, f"http://127.0.0.1:{port}/health", f"http://127.0.0.1:{port}"


TARGETS: dict[str, TargetFn | None] = {
    "epp-default": _gateway("ray_epp/configs/default.yaml"),
    "sglang-cache-aware": _sglang("cache_aware"),
    "sglang-round-robin": _sglang("round_robin"),
    "vllm-router-cache-aware": _vllm_router,
    "serve-forwarder": _serve_forwarder,
    "direct": None,  # no router: the client sends to the pods in turn (round-robin)
}
DEFAULT_TARGETS = (
    "epp-default",
    "sglang-cache-aware",
    "sglang-round-robin",
    "vllm-router-cache-aware",
    "serve-forwarder",
)


class TargetUnavailable(RuntimeError):
    """The target's binary is not installed."""


def target(name: str) -> TargetFn | None:
    """The named target; any other of our configs (`epp-<x>`, `epp:<path>`, as the cluster
    simulation names them) is the gateway with that config."""
    if name in TARGETS:
        return TARGETS[name]
    if is_ours(name) and config_path(name).is_file():
        return _gateway(str(config_path(name)))
    raise ValueError(f"unknown e2e target {name!r}; known: {', '.join(TARGETS)}, or epp-<config> / epp:<path>")


@contextlib.contextmanager
def sim_pods(pods: list[PodConfig], time_scale: float, seed: int, tmp: Path):
    """The pods as simulated vLLM servers in a child process; yields the pods JSON list."""
    config = tmp / "pods.json.yaml"
    config.write_text(json.dumps([p.model_dump(mode="json") for p in pods]))
    out = tmp / "pods.json"
    out.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "ray_epp.simulator", "--config", str(config), "--base-port", "0"]
    cmd += ["--time-scale", str(time_scale), "--seed", str(seed), "--pods-json", str(out)]
    # readiness: the pods JSON is written once every pod listens; then /health on the first pod
    with _process(cmd, None, tmp / "sim.log") as proc:
        deadline = time.monotonic() + 60
        while not out.exists() or not out.read_text().strip():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"simulated pods did not start: {(tmp / 'sim.log').read_text()[-2000:]}")
            time.sleep(0.1)
        listed = json.loads(out.read_text())
        for p in listed:
            _wait_http(f"http://{p['address']}:{p['port']}/health", 30)
        yield listed


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_ready(proc: subprocess.Popen, url: str, timeout_s: float) -> None:
    """Until `url` answers 200; RuntimeError when the process exits or the time is up."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode} before {url} answered")
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as r:
            if r.status == 200:
                return
        time.sleep(0.3)
    raise RuntimeError(f"{url} not ready after {timeout_s:g} s")


@dataclass
class E2EDriver:
    name = "e2e"
    time_scale: float = 1.0
    max_requests: int = 300
    timeout_s: float = 60.0  # wall seconds after the last arrival before unfinished requests count as errors
    warmup: int = 8
    start_timeout_s: float = 120.0
    port: int = 0  # the router's port; 0 = a free one per run
    # Requests that bypass the router (bench.workloads.shared_pool's direct clients): each goes to a
    # pod drawn at random, as a Kubernetes Service would send it, and the router never sees it.
    bypass: Callable[[SimRequest], bool] | None = None
    api: str = "chat"  # the API a chat request is sent over (bench/api_shapes.py)

    def run(self, policy: str, pods: list[PodConfig], workload: list[SimRequest], seed: int) -> RunResult:
        make = target(policy)
        workload = sorted(workload, key=lambda r: r.arrival_time)[: self.max_requests]
        with tempfile.TemporaryDirectory(prefix="epp-e2e-") as td:
            tmp = Path(td)
            with sim_pods(pods, self.time_scale, seed, tmp) as listed:
                workers = [f"http://{p['address']}:{p['port']}" for p in listed]
                if make is None:
                    return self._measure(workers, workers, workload)
                spec = make(workers, tmp / "pods.json", self.port or _free_port())
                if spec is None:
                    raise TargetUnavailable(f"{policy}: its binary is not installed (pip install -e .[peers])")
                cmd, ready, base = spec
                log = tmp / (re.sub(r"[^\w.-]+", "_", policy) + ".log")  # epp:<path> has slashes
                with _process(cmd, None, log) as proc:
                    try:
                        _wait_ready(proc, ready, self.start_timeout_s)
                    except RuntimeError as err:  # reported as a run where every request failed
                        outcomes = [_failed(r) for r in workload]
                        tail = log.read_text()[-4000:]  # a config error lists every known plugin type
                        return RunResult(outcomes, summarize(outcomes), {"errors": {"start": f"{err}; log: {tail}"}})
                    return self._measure([base], workers, workload, seed)

    def _measure(self, bases: list[str], workers: list[str], workload: list[SimRequest], seed: int = 0) -> RunResult:
        wall0 = time.perf_counter()
        to = destinations(workload, bases, workers, self.bypass, seed)
        replay = _replay(bases, workload, self.time_scale, self.timeout_s, self.warmup, to, self.api)
        outcomes, warm_errors = asyncio.run(replay)
        metrics = summarize(outcomes)
        metrics["time_scale"] = self.time_scale
        metrics["api"] = self.api
        metrics["wall_s"] = time.perf_counter() - wall0
        extra: dict[str, Any] = {}
        errors = [o.request_id for o in outcomes if o.status == ERROR]
        if errors or warm_errors:
            extra["errors"] = {"requests": errors[:5], "warmup": warm_errors[:3], "why": failure_split(outcomes)}
        return RunResult(outcomes, metrics, extra)


def destinations(
    workload: list[SimRequest],
    bases: list[str],
    workers: list[str],
    bypass: Callable[[SimRequest], bool] | None,
    seed: int,
) -> list[str]:
    """Where each request is sent: the router's bases in turn, or, for a request `bypass` marks,
    a pod drawn at random (seeded as the cluster simulation's ServiceBypass draws it)."""
    service = random.Random(f"service:{seed}")
    return [
        service.choice(workers) if bypass is not None and bypass(r) else bases[i % len(bases)]
        for i, r in enumerate(workload)
    ]


def failure_split(outcomes: list[Outcome], key: Callable[[Outcome], str] | None = None) -> dict[str, Any]:
    """Outcomes that are not ok, counted by status and reason (and by `key`, e.g. priority),
    each with its first answer's words: what "N failed" was made of."""
    out: dict[str, Any] = {}
    for o in outcomes:
        if o.status == OK:
            continue
        name = f"{o.status}: {o.reason or '?'}"
        entry = out.setdefault(name, {"n": 0, "example": o.detail})
        entry["n"] += 1
        if key is not None:
            by = entry.setdefault("by", {})
            by[key(o)] = by.get(key(o), 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["n"]))


def _url(base: str, path: str) -> str:
    if not base.startswith(("http://127.0.0.1", "http://localhost")):
        raise ValueError(f"benchmarks only target 127.0.0.1, not {base}")
    return base + path


def _previous_turns(workload: list[SimRequest], api: str) -> dict[str, SimRequest]:
    """request id → its session's previous turn in `workload`, for the turns that chain to it
    (bench/api_shapes.py); a session's first turn in the run starts its conversation afresh."""
    last: dict[str, SimRequest] = {}
    out = {}
    for req in workload:
        session = req.headers.get(SESSION_HEADER)
        if session is None or not chains(api, req):
            continue
        if session in last:
            out[req.request_id] = last[session]
        last[session] = req
    return out


async def _replay(
    bases: list[str],
    workload: list[SimRequest],
    scale: float,
    timeout_s: float,
    warmup: int,
    to: list[str] | None = None,
    api: str = "chat",
) -> tuple[list[Outcome], list[str]]:
    """Sends request i to `to[i]` (default: the bases in turn) over `api` (bench/api_shapes.py),
    after `warmup` short requests."""
    # Idle connections are dropped before a server would close them (uvicorn, the gateway's
    # server: 5 s): else a request sent on one as it closes fails at once, ServerDisconnected.
    conn = aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as s:
        warm_errors = []
        for i in range(warmup):
            body = {"model": workload[0].model if workload else "", "prompt": f"warm-up {i} " * 8, "max_tokens": 4}
            body.update(stream=True, stream_options={"include_usage": True})
            try:
                async with s.post(_url(bases[i % len(bases)], "/v1/completions"), json=body) as r:
                    await r.read()
                    if r.status != 200:
                        warm_errors.append(f"{r.status}")
            except aiohttp.ClientError as err:
                warm_errors.append(repr(err))
        t0 = time.perf_counter() + 0.05
        progress = {r.request_id: _Progress() for r in workload}  # how far each got, for the ones cut off
        previous = _previous_turns(workload, api)
        ids = {r.request_id: asyncio.get_running_loop().create_future() for r in workload}  # Responses ids
        tasks = [
            asyncio.create_task(
                _one(s, base, req, t0, scale, progress[req.request_id], api, previous.get(req.request_id), ids)
            )
            for base, req in zip(to or [bases[i % len(bases)] for i in range(len(workload))], workload, strict=True)
        ]
        last = max((r.arrival_time for r in workload), default=0.0) * scale
        done, pending = await asyncio.wait(tasks, timeout=last + 0.05 + timeout_s)
        cut = time.perf_counter()
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    outcomes = []
    for req, task in zip(workload, tasks, strict=True):
        if task not in done:
            outcomes.append(progress[req.request_id].cut_off(req, cut, scale, timeout_s))
        elif task.exception() is not None:
            err = task.exception()
            outcomes.append(_failed(req, reason=f"client {type(err).__name__}", detail=str(err)[:200]))
        else:
            outcomes.append(task.result())
    return outcomes, warm_errors


@dataclass(slots=True)
class _Progress:
    """How far a request got, so one still open at the cut-off says whether it was queued,
    streaming slowly or stalled (its last chunk long before the cut)."""

    stage: str = "not sent"
    sent: float = math.nan
    first: float = math.nan
    last: float = math.nan
    tokens: int = 0

    def cut_off(self, req: SimRequest, cut: float, scale: float, timeout_s: float) -> Outcome:
        out = _failed(req, reason=f"unfinished at cut-off ({self.stage})")
        out.ttft, out.output_tokens = (self.first - self.sent) / scale, self.tokens
        out.detail = f"{timeout_s:g} s wall after the last arrival; sent {cut - self.sent:.1f} s before it"
        if self.tokens:
            out.detail += f", {self.tokens} token chunks, the last {cut - self.last:.1f} s before it"
        return out


def _failed(req: SimRequest, status: str = ERROR, reason: str = "", detail: str = "", e2e: float = math.nan) -> Outcome:
    return Outcome(
        req.request_id, status, req.arrival_time, req.priority, req.model, e2e=e2e,
        prompt_tokens=req.prompt_tokens, reason=reason, detail=detail,
    )  # fmt: skip


async def _refused(req: SimRequest, r: aiohttp.ClientResponse, after: float, scale: float) -> Outcome:
    """A 429 (shed) or another status (error), keyed by the status, the gateway's error `code`
    and flow control's dropped reason, so TTL expiry, a full queue and upstream failures part."""
    raw = await r.read()
    code, message = "", raw[:200].decode(errors="replace")
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        err = json.loads(raw)["error"]
        code, message = str(err.get("code") or ""), str(err.get("message") or "")
    dropped = r.headers.get(DROPPED_REASON_HEADER, "")
    reason = " ".join(x for x in (f"http {r.status}", code, dropped) if x)
    status = SHED if r.status == 429 else ERROR
    return _failed(req, status, reason, f"{message[:200]} (after {after:.1f} s wall)", e2e=after / scale)


async def _one(
    s: aiohttp.ClientSession,
    base: str,
    req: SimRequest,
    t0: float,
    scale: float,
    progress: _Progress | None = None,
    api: str = "chat",
    previous: SimRequest | None = None,
    ids: dict[str, asyncio.Future[str | None]] | None = None,
) -> Outcome:
    """One request over `api`; a turn that chains to `previous` waits for its response id (in
    `ids`, where this turn leaves its own, or None when it fails)."""
    reader = StreamReader(api_of(api, req))
    try:
        return await _send(s, base, req, t0, scale, progress, api, previous, ids, reader)
    finally:
        mine = None if ids is None else ids.get(req.request_id)
        if mine is not None and not mine.done():
            mine.set_result(reader.response_id if reader.done and reader.error is None else None)


async def _send(
    s: aiohttp.ClientSession,
    base: str,
    req: SimRequest,
    t0: float,
    scale: float,
    progress: _Progress | None,
    api: str,
    previous: SimRequest | None,
    ids: dict[str, asyncio.Future[str | None]] | None,
    reader: StreamReader,
) -> Outcome:
    p = _Progress() if progress is None else progress
    await asyncio.sleep(max(0.0, t0 + req.arrival_time * scale - time.perf_counter()))
    chained = None
    if previous is not None and ids is not None:
        p.stage = "waiting for the previous turn's answer"
        response_id = await ids[previous.request_id]
        if response_id is None:
            return _failed(req, reason="previous turn failed", detail=f"{previous.request_id} left no response id")
        chained = (previous, response_id)
    path, body = request(api, req, chained)
    headers = dict(req.headers)
    if req.priority:
        headers.setdefault(PRIORITY_HEADER, str(req.priority))
    sent = p.sent = time.perf_counter()
    first = last = math.nan
    finished = False
    p.stage = "no answer yet"
    try:
        async with s.post(_url(base, path), json=body, headers=headers) as r:
            if r.status != 200:
                return await _refused(req, r, time.perf_counter() - sent, scale)
            p.stage = "headers, no token yet"
            buf = b""
            async for chunk in r.content.iter_any():
                now = time.perf_counter()
                buf += chunk
                *events, buf = buf.split(b"\n\n")
                for ev in events:  # `data:` (after an `event:` line, in the Responses and Anthropic streams)
                    data = next((ln[5:].strip() for ln in ev.split(b"\n") if ln.startswith(b"data:")), None)
                    if data is None:
                        continue
                    if data == b"[DONE]":
                        finished = True
                        continue
                    texted = reader.feed(json.loads(data))
                    if reader.error is not None:  # the gateway ends a stream its upstream broke with an error event
                        err = reader.error
                        reason = f"stream error event {err.get('code') or ''}".rstrip()
                        after = f"(after {now - sent:.1f} s wall, {'no' if math.isnan(first) else 'some'} tokens)"
                        return _failed(req, reason=reason, detail=f"{str(err.get('message'))[:200]} {after}")
                    if texted:
                        if math.isnan(first):
                            first = p.first = now
                            p.stage = "streaming"
                        last = p.last = now
                        p.tokens += 1
            finished = finished or reader.done
    except (TimeoutError, aiohttp.ClientError, json.JSONDecodeError) as err:
        # before the answer's head: connect error, reset; after it: the stream was cut mid-way
        where = "client" if p.stage == "no answer yet" else "stream cut:"
        after = time.perf_counter() - sent
        return _failed(req, reason=f"{where} {type(err).__name__}", detail=f"{err!s:.200} (after {after:.1f} s wall)")
    if not finished or math.isnan(first):
        reason = "stream ended without [DONE]" if not finished else "stream without tokens"
        return _failed(req, reason=reason, detail=f"after {time.perf_counter() - sent:.1f} s wall")
    prompt_tokens, out_tokens, cached_tokens = reader.counts()
    return Outcome(
        request_id=req.request_id,
        status=OK,
        arrival=req.arrival_time,
        priority=req.priority,
        model=req.model,
        ttft=(first - sent) / scale,
        itl=(last - first) / (out_tokens - 1) / scale if out_tokens > 1 else math.nan,
        e2e=(last - sent) / scale,
        prompt_tokens=prompt_tokens or req.prompt_tokens,
        cached_tokens=cached_tokens,
        output_tokens=out_tokens,
    )
