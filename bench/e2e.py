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
import importlib.util
import json
import random
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.drivers import RunResult
from bench.gateway_overhead import ROOT, _bin, _process, _wait_http
from bench.metrics import ERROR, OK, Outcome, summarize
from bench.policies import config_path, is_ours
from bench.replay_client import failure, replay
from ray_epp.simulator import PodConfig, SimRequest

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


def _smg(policy: str) -> TargetFn:
    """SMG (the SGLang Model Gateway, sglang-router's successor) as `smg launch` runs it, every
    routing setting its default; its metrics on a free port of 127.0.0.1 (the default, 0.0.0.0:29000,
    would collide with any other SMG on the machine)."""

    def make(workers: list[str], pods_json: Path, port: int) -> tuple[list[str], str, str] | None:
        sm = _bin("smg")
        if sm is None:
            return None
        cmd = [sm, "launch", "--worker-urls", *workers, "--policy", policy, "--host", "127.0.0.1", "--port", str(port)]
        cmd += ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(_free_port())]
        return cmd, f"http://127.0.0.1:{port}/health", f"http://127.0.0.1:{port}"

    return make


def _dynamo_kv(workers: list[str], pods_json: Path, port: int) -> tuple[list[str], str, str] | None:
    """Dynamo's selection core behind bench/dynamo_forwarder.py, fed the pods' KV events."""
    if importlib.util.find_spec("dynamo") is None:
        return None
    cmd = [sys.executable, "-m", "bench.dynamo_forwarder", "--port", str(port), "--pods", str(pods_json)]
    return cmd, f"http://127.0.0.1:{port}/health", f"http://127.0.0.1:{port}"


def _serve_forwarder(workers: list[str], pods_json: Path, port: int) -> tuple[list[str], str, str]:
    cmd = [sys.executable, "-m", "bench.serve_forwarder", "--port", str(port), "--workers", *workers]
    return cmd, f"http://127.0.0.1:{port}/health", f"http://127.0.0.1:{port}"


TARGETS: dict[str, TargetFn | None] = {
    "epp-default": _gateway("ray_epp/configs/default.yaml"),
    "sglang-cache-aware": _sglang("cache_aware"),
    "sglang-round-robin": _sglang("round_robin"),
    "smg-cache-aware": _smg("cache_aware"),
    "dynamo-kv": _dynamo_kv,
    "vllm-router-cache-aware": _vllm_router,
    "serve-forwarder": _serve_forwarder,
    "direct": None,  # no router: the client sends to the pods in turn (round-robin)
}
NEEDS_KV_EVENTS = frozenset({"dynamo-kv"})  # targets that read the pods' KV events (pods.json's kvEvents)
INSTALL = {"dynamo-kv": "pip install --no-deps ai-dynamo-runtime==1.6.1"}  # else: pip install -e .[peers]
DEFAULT_TARGETS = (
    "epp-default",
    "sglang-cache-aware",
    "sglang-round-robin",
    "vllm-router-cache-aware",
    "serve-forwarder",
)


class TargetUnavailable(RuntimeError):
    """The target's binary or package is not installed."""


def target(name: str) -> TargetFn | None:
    """The named target; any other of our configs (`epp-<x>`, `epp:<path>`, as the cluster
    simulation names them) is the gateway with that config."""
    if name in TARGETS:
        return TARGETS[name]
    if is_ours(name) and config_path(name).is_file():
        return _gateway(str(config_path(name)))
    raise ValueError(f"unknown e2e target {name!r}; known: {', '.join(TARGETS)}, or epp-<config> / epp:<path>")


def installed(name: str) -> bool:
    """Whether the target can start here (its binary or package is installed)."""
    make = target(name)
    return make is None or make(["http://127.0.0.1:1"], Path("pods.json"), 1) is not None


def unavailable(name: str) -> TargetUnavailable:
    return TargetUnavailable(f"{name}: it is not installed ({INSTALL.get(name, 'pip install -e .[peers]')})")


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


def _wait_answering(proc: subprocess.Popen, base: str, model: str, timeout_s: float) -> None:
    """Until a one-token completion through the target answers 200: a router can be healthy before
    it knows its workers (SMG answers 404 until its worker discovery has run)."""
    body = json.dumps({"model": model, "prompt": "are you there?", "max_tokens": 1}).encode()
    deadline = time.monotonic() + timeout_s
    status: object = "no answer"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode} before it answered a completion")
        req = urllib.request.Request(f"{base}/v1/completions", body, {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                if r.status == 200:
                    return
        except urllib.error.HTTPError as err:
            status = err.code
        except OSError as err:
            status = repr(err)
        time.sleep(0.3)
    raise RuntimeError(f"{base} answered no completion in {timeout_s:g} s (last: {status})")


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
    # Each request's source address, its client as the router sees it (bench.flow_control_e2e's
    # tenants); None: every request from one client.
    source: Callable[[SimRequest], str | None] | None = None
    # Every pod publishes vLLM KV events (as with --kv-events-config), whichever target runs, so
    # the pods cost the same CPU for every target; on anyway for a target in NEEDS_KV_EVENTS.
    kv_events: bool = False

    def run(self, policy: str, pods: list[PodConfig], workload: list[SimRequest], seed: int) -> RunResult:
        make = target(policy)
        if not installed(policy):
            raise unavailable(policy)
        workload = sorted(workload, key=lambda r: r.arrival_time)[: self.max_requests]
        if self.kv_events or policy in NEEDS_KV_EVENTS:
            pods = [p.model_copy(update={"kv_events": True}) for p in pods]
        with tempfile.TemporaryDirectory(prefix="epp-e2e-") as td:
            tmp = Path(td)
            with sim_pods(pods, self.time_scale, seed, tmp) as listed:
                workers = [f"http://{p['address']}:{p['port']}" for p in listed]
                if make is None:
                    return self._measure(workers, workers, workload)
                spec = make(workers, tmp / "pods.json", self.port or _free_port())
                if spec is None:
                    raise unavailable(policy)
                cmd, ready, base = spec
                log = tmp / (re.sub(r"[^\w.-]+", "_", policy) + ".log")  # epp:<path> has slashes
                with _process(cmd, None, log) as proc:
                    try:
                        _wait_ready(proc, ready, self.start_timeout_s)
                        _wait_answering(proc, base, workload[0].model if workload else "", self.start_timeout_s)
                    except RuntimeError as err:  # reported as a run where every request failed
                        outcomes = [failure(r) for r in workload]
                        tail = log.read_text()[-4000:]  # a config error lists every known plugin type
                        return RunResult(outcomes, summarize(outcomes), {"errors": {"start": f"{err}; log: {tail}"}})
                    return self._measure([base], workers, workload, seed)

    def _measure(self, bases: list[str], workers: list[str], workload: list[SimRequest], seed: int = 0) -> RunResult:
        wall0 = time.perf_counter()
        to = destinations(workload, bases, workers, self.bypass, seed)
        sources = None if self.source is None else [self.source(r) for r in workload]
        replaying = replay(bases, workload, self.time_scale, self.timeout_s, self.warmup, to, self.api, sources)
        outcomes, warm_errors = asyncio.run(replaying)
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
