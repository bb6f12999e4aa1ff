"""Ray Serve's request routers against EPPRequestRouter, in a real Serve on simulated LLM replicas.

Same run, same replicas (bench/serve_llm_replica.py: the simulator's engine behind each
FakeLLMServer replica), same seeded workloads (bench/workloads): for each workload and router a
deployment of `--replicas` FakeLLMServers is started with that router, the workload is sent through
a deployment handle from this process at its Poisson arrival times (LoRA requests with
`multiplexed_model_id`, as Ray Serve LLM's ingress does), and the deployment is deleted.

Routers: `epp` (EPPRequestRouter with ray_epp/configs/default.yaml, or ray_epp/configs/lora.yaml on multi-LoRA),
`pow2` (Serve's default PowerOfTwoChoicesRequestRouter) and `prefix-affinity` (ray.llm's
PrefixCacheAffinityRouter, imported from ray.llm._internal...prefix_aware, which needs no vLLM; the
public `ray.serve.llm.request_router` re-export imports `ray.serve.llm`, which needs pyarrow).
All three run as thin subclasses (`TimedPowerOfTwo`, `TimedPrefixCacheAffinity`, `TimedEPP`) that
time `choose_replicas` and stamp each request's steps in the router (nothing else changes), so
every request's TTFT splits into phases (`phases`). One unmeasured run comes first (`settle`).

Per run: TTFT p50/p90 as the caller sees it (its latency minus the replica's first-token-to-end
time: routing, Serve's queueing, prefill), the prefix-cache hit rate (prompt tokens the engines
served from cache / prompt tokens), the destination spread, and choose_replicas p50/p90. Then
choose_replicas at `--overhead-replicas` replicas for every router.

    python -m bench.serve_llm_routing            # the figures in docs/BENCHMARKS.md
    python -m bench.serve_llm_routing --tiny     # a smoke-sized run (tests/bench)
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib
import json
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray import serve
from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router import PrefixCacheAffinityRouter
from ray.serve._private.request_router.pow_2_router import PowerOfTwoChoicesRequestRouter
from ray.serve.config import RequestRouterConfig

from bench import workloads as wl
from bench.serve_llm_replica import FakeLLMServer, request_model
from ray_epp.simulator import DEFAULT_MODEL, SimRequest
from serve_app.llm_router.router import ROUTER_NAMESPACE, EPPRequestRouter, read_config, router_stats

ROOT = Path(__file__).resolve().parents[1]
MODULE = "bench.serve_llm_routing"  # by name, also when run as __main__ (Serve imports the classes from here)
ROUTERS = ("epp", "pow2", "prefix-affinity")
STATS_PERIOD_S = 0.2
GROUP_CHARS = 200  # a prompt's first characters name its shared-prefix group
REQUEST_TIMEOUT_S = 120.0  # a request not answered by then is an error of the run, not a hang of the benchmark


# --- Serve's routers, timed ------------------------------------------------------------------------


def _samples() -> dict[str, tuple[str, list[float]]]:
    """Deployment name -> (the timed router's class, its choose_replicas durations), in this process
    (kept in the imported module: Serve ships router classes with cloudpickle, whose copies have
    globals of their own)."""
    return vars(importlib.import_module(MODULE)).setdefault("_CHOOSE_S", {})


def _timelines() -> dict[str, dict[str, float]]:
    """Internal request id -> when (wall clock) Serve made its pending request, the router first
    began and last ended choose_replicas, and Serve reported it routed; in this process (see
    `_samples`)."""
    return vars(importlib.import_module(MODULE)).setdefault("_TIMELINES", {})


def _router_loops() -> dict[str, asyncio.AbstractEventLoop]:
    """Deployment name -> the event loop its router runs on (Serve runs routers on a loop of their
    own, in another thread than the caller's); in this process (see `_samples`)."""
    return vars(importlib.import_module(MODULE)).setdefault("_ROUTER_LOOPS", {})


class _Timed:
    """Times choose_replicas and stamps each request's steps in the router (every router alike)."""

    times_itself = False  # EPPRequestRouter keeps its own choose_replicas samples

    async def choose_replicas(self, candidate_replicas, pending_request=None):  # type: ignore[no-untyped-def]
        started, wall = time.perf_counter(), time.time()
        try:
            return await super().choose_replicas(candidate_replicas, pending_request)  # type: ignore[misc]
        finally:
            if pending_request is not None:
                name = self._deployment_id.name  # type: ignore[attr-defined]
                _router_loops()[name] = self._event_loop  # type: ignore[attr-defined]
                if not self.times_itself:
                    _samples().setdefault(name, (type(self).__name__, []))[1].append(time.perf_counter() - started)
                first = {"created": pending_request.created_at, "choose_start": wall}
                line = _timelines().setdefault(pending_request.metadata.internal_request_id, first)
                line["choose_end"] = time.time()

    def on_request_routed(self, pending_request, replica_id, result):  # type: ignore[no-untyped-def]
        line = _timelines().get(pending_request.metadata.internal_request_id)
        if line is not None:
            line["routed"] = time.time()
        super().on_request_routed(pending_request, replica_id, result)  # type: ignore[misc]


class TimedPowerOfTwo(_Timed, PowerOfTwoChoicesRequestRouter):
    """Serve's default router, timed."""


class TimedEPP(_Timed, EPPRequestRouter):
    """EPPRequestRouter with the same per-request stamps as Serve's two (it times choose itself)."""

    times_itself = True


class TimedPrefixCacheAffinity(_Timed, PrefixCacheAffinityRouter):
    """ray.llm's PrefixCacheAffinityRouter (its defaults), timed."""


# EPPRequestRouter, and with its Serve-side mechanisms off one by one (`--routers`, to measure them):
# "learn-routed", the mirror learns a decision when Serve reports it routed, not when it is made;
# "completion-only", no first tokens inferred from the published queues (the ledger holds a prompt
# until the request completes); "before" both, as the router was before these mechanisms.
EPP_VARIANTS: dict[str, dict[str, Any]] = {
    "epp": {},
    "epp-learn-routed": {"learn_on_decision": False},
    "epp-completion-only": {"infer_first_token": False},
    "epp-before": {"learn_on_decision": False, "infer_first_token": False},
    "epp-sync50": {"sync_interval_s": 0.05},
    "epp-traced": {"trace_decisions": 5000},  # each decision's scores in the answers (`--details`)
    # prefill-eta-scorer instead of prefill-backlog-scorer (epp_config): a pending prompt fades over
    # its predicted TTFT, so a first token inferred late (the routing-stats period) does not hold it
    # at full weight.
    "epp-eta": {},
}


def epp_config(workload: str, router: str = "epp") -> str:
    if router == "epp-eta":
        return "bench/configs/lora-eta.yaml" if workload == "multi-lora" else "bench/configs/default-eta.yaml"
    return "ray_epp/configs/lora.yaml" if workload == "multi-lora" else "ray_epp/configs/default.yaml"


def router_config(router: str, workload: str) -> RequestRouterConfig:
    if router in EPP_VARIANTS:
        cls, kwargs = f"{MODULE}:TimedEPP", {"config": epp_config(workload, router)} | EPP_VARIANTS[router]
    elif router == "pow2":
        cls, kwargs = f"{MODULE}:TimedPowerOfTwo", {}
    elif router == "prefix-affinity":
        cls, kwargs = f"{MODULE}:TimedPrefixCacheAffinity", {}
    else:
        raise ValueError(f"unknown router {router!r}; choose from {ROUTERS}")
    return RequestRouterConfig(
        request_router_class=cls,
        request_router_kwargs=kwargs,
        request_routing_stats_period_s=STATS_PERIOD_S,
        request_routing_stats_timeout_s=2.0,
    )


# --- workloads -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Shape:
    """The run's size: workload lengths, rate and the replicas' KV cache."""

    requests: int = 240
    rate: float = 12.0
    groups: int = 16
    system_tokens: int = 2048
    question_tokens: int = 128
    output_tokens: int = 64
    num_gpu_blocks: int = 1024  # 16k tokens a replica: ~7 of the 16 shared prefixes fit
    lora_prompt_tokens: tuple[int, int] = (128, 1024)
    lora_output_tokens: tuple[int, int] = (16, 64)


TINY = Shape(requests=24, rate=12.0, groups=4, system_tokens=512, output_tokens=8, num_gpu_blocks=256,
             lora_output_tokens=(4, 8))  # fmt: skip


# RAG- or agent-shaped traffic as Ray Serve LLM deployments meet it: a long shared system prompt
# (instructions, tool definitions) per application, a long unique part per request (retrieved
# context, the conversation so far), at twice the rate. A hit still prefills ~1k tokens (~31 ms on
# the simulator's 8B-on-H100 timing), a miss ~5k (~150 ms), so the engines spend a good part of
# their time in prefill and where a request waits matters; the KV cache (32k tokens a replica)
# holds ~6 of the 16 prefixes, the same pressure as `shared-prefix`. Chosen before it was run.
LONG_PREFIX = {"requests": 480, "rate": 24.0, "system_tokens": 4096, "question_tokens": 1024,
               "num_gpu_blocks": 2048}  # fmt: skip
WORKLOADS = ("shared-prefix", "long-prefix", "multi-lora")


def shape_for(name: str, shape: Shape) -> Shape:
    """The run's shape for workload `name`: long-prefix has its own sizes, not the command line's."""
    return Shape(**{**asdict(shape), **LONG_PREFIX}) if name == "long-prefix" and shape != TINY else shape


def workload(name: str, shape: Shape, seed: int) -> list[SimRequest]:
    if name in ("shared-prefix", "long-prefix"):
        spec = wl.SharedPrefixSpec(
            groups=shape.groups, prompts_per_group=max(1, shape.requests // shape.groups),
            system_tokens=shape.system_tokens, question_tokens=shape.question_tokens,
            output_tokens=shape.output_tokens,
        )  # fmt: skip
        return wl.shared_prefix_workload(spec, shape.rate, seed, shape.requests)
    if name == "multi-lora":
        spec = wl.RandomPromptSpec(
            num_requests=shape.requests, prompt_tokens=shape.lora_prompt_tokens,
            output_tokens=shape.lora_output_tokens, adapters=wl.LORA_ADAPTERS,
        )  # fmt: skip
        return wl.random_prompt_workload(spec, shape.rate, seed)
    raise ValueError(f"unknown workload {name!r}")


def pod_config(name: str, shape: Shape) -> dict[str, Any]:
    pod: dict[str, Any] = {"num_gpu_blocks": shape.num_gpu_blocks}
    if name == "multi-lora":
        pod["lora_adapters"] = list(wl.LORA_ADAPTERS)
    return pod


# --- one run ---------------------------------------------------------------------------------------


@dataclass(slots=True)
class RunResult:
    workload: str
    router: str
    replicas: int
    requests: int
    failed: int
    ttft_p50_ms: float
    ttft_p90_ms: float
    engine_ttft_p90_ms: float  # inside the replica: the engine's queue and prefill only
    e2e_p90_ms: float
    hit_rate: float
    spread: dict[str, int]
    choose_p50_ms: float | None
    choose_p90_ms: float | None
    routed_by: str  # the router class that timed this run's choices (Serve caches routers by deployment)
    wall_s: float
    errors: list[str] = field(default_factory=list)
    diagnosis: dict[str, Any] = field(default_factory=dict)  # see `diagnose`
    router_debug: dict[str, Any] = field(default_factory=dict)  # EPP only: see `epp_debug`


def diagnose(answers: list[dict[str, Any]]) -> dict[str, Any]:
    """Why engine TTFTs are what they are: misses (less than half the prompt cached) and the
    requests that reached their replica while a miss there was still waiting for its first token
    (queued behind its prefill), the routing delay (caller's TTFT minus the engine's), and how many
    replicas each shared-prefix group was spread over."""
    misses = [a for a in answers if a["cached_tokens"] < a["prompt_tokens"] / 2]
    behind = [
        a for a in answers
        if any(m is not a and m["replica"] == a["replica"] and m["engine_start"] <= a["engine_start"]
               < m["engine_start"] + m["ttft_s"] for m in misses)
    ]  # fmt: skip
    hits = [a for a in answers if a not in misses]
    groups: dict[str, set[str]] = {}
    for a in answers:
        groups.setdefault(a["group"], set()).add(a["replica"])
    return {
        "misses": len(misses),
        "behind_a_miss": len(behind),
        "hit_engine_ttft_p50_ms": 1e3 * quantile([a["ttft_s"] for a in hits], 0.5),
        "hit_engine_ttft_p90_ms": 1e3 * quantile([a["ttft_s"] for a in hits], 0.9),
        "miss_engine_ttft_p90_ms": 1e3 * quantile([a["ttft_s"] for a in misses], 0.9),
        "routing_delay_p50_ms": 1e3 * quantile([a["ttft_client_s"] - a["ttft_s"] for a in answers], 0.5),
        "routing_delay_p90_ms": 1e3 * quantile([a["ttft_client_s"] - a["ttft_s"] for a in answers], 0.9),
        "routing_delay_max_ms": 1e3 * max((a["ttft_client_s"] - a["ttft_s"] for a in answers), default=0.0),
        "groups": len(groups),
        "replicas_per_group": dict(sorted(Counter(len(r) for r in groups.values()).items())),
    }


PHASES = ("to_router", "router_queue", "choose", "dispatch", "replica_prep", "engine", "back")


def phases(answer: dict[str, Any], line: dict[str, float] | None) -> dict[str, float] | None:
    """Where one request's caller TTFT went, in seconds (they sum to it): the handle's hop to the
    router (`to_router`: call to Serve's pending request), the wait for a routing task
    (`router_queue`), `choose` (first choose_replicas start to last end: several on back-off),
    `dispatch` (the choice to the replica's method starting: Serve's rejection round trip and the
    actor call), `replica_prep` (the method before the engine call), `engine` (the engine's queue
    and prefill) and `back` (the answer's way back to the caller)."""
    if line is None or "choose_end" not in line:
        return None
    out = {
        "to_router": line["created"] - answer["sent_wall"],
        "router_queue": line["choose_start"] - line["created"],
        "choose": line["choose_end"] - line["choose_start"],
        "dispatch": answer["received_wall"] - line["choose_end"],
        "replica_prep": answer["prep_s"],
        "engine": answer["ttft_s"],
    }
    out["back"] = answer["ttft_client_s"] - sum(out.values())
    return out


def breakdown(answers: list[dict[str, Any]]) -> dict[str, Any]:
    """The phases' p50 / p90 over all requests, and their mean over the slowest tenth (TTFT at or
    above its p90): what the tail is made of."""
    split = [(a["ttft_client_s"], p) for a in answers if (p := a.get("phases"))]
    if not split:
        return {}
    cut = quantile([t for t, _ in split], 0.9)
    tail = [p for t, p in split if t >= cut]
    out: dict[str, Any] = {"timed": len(split)}
    for name in PHASES:
        values = [p[name] for _, p in split]
        out[name] = {"p50_ms": 1e3 * quantile(values, 0.5), "p90_ms": 1e3 * quantile(values, 0.9),
                     "tail_mean_ms": 1e3 * sum(p[name] for p in tail) / len(tail)}  # fmt: skip
    return out


DETAILS: dict[str, list[dict[str, Any]]] = {}  # run name -> its answers (`--details`)


class LoopWatch:
    """While a run is sent: how late this process's event loop wakes (the routers, the handle and
    the sender share it, so a stall delays every request routed in it) and the garbage
    collector's pauses here."""

    TICK_S = 0.002

    def __init__(self, router_loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.late_s: list[float] = []
        self.router_late_s: list[float] = []  # the same on the router's own loop
        self.gc_s: list[float] = []
        self._gc_started = 0.0
        self._task: asyncio.Task | None = None
        self._router_loop = router_loop
        self._router_task: Any = None

    async def _tick(self, into: list[float]) -> None:
        while True:
            before = time.perf_counter()
            await asyncio.sleep(self.TICK_S)
            into.append(time.perf_counter() - before - self.TICK_S)

    def _gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        elif info.get("generation", 0) >= 1:
            self.gc_s.append(time.perf_counter() - self._gc_started)

    def __enter__(self) -> LoopWatch:
        gc.callbacks.append(self._gc)
        self._task = asyncio.get_running_loop().create_task(self._tick(self.late_s))
        if self._router_loop is not None and self._router_loop is not asyncio.get_running_loop():
            self._router_task = asyncio.run_coroutine_threadsafe(self._tick(self.router_late_s), self._router_loop)
        return self

    def __exit__(self, *_: Any) -> None:
        gc.callbacks.remove(self._gc)
        if self._task is not None:
            self._task.cancel()
        if self._router_task is not None:
            self._router_task.cancel()

    def summary(self) -> dict[str, Any]:
        late = sorted(self.late_s)
        return {
            "loop_late_p50_ms": 1e3 * quantile(late, 0.5),
            "loop_late_p99_ms": 1e3 * quantile(late, 0.99),
            "loop_late_max_ms": 1e3 * max(late, default=0.0),
            "loop_late_over_50ms": sum(1 for x in late if x > 0.05),
            "router_loop_late_p50_ms": 1e3 * quantile(self.router_late_s, 0.5),
            "router_loop_late_p90_ms": 1e3 * quantile(self.router_late_s, 0.9),
            "router_loop_late_p99_ms": 1e3 * quantile(self.router_late_s, 0.99),
            "router_loop_late_max_ms": 1e3 * max(self.router_late_s, default=0.0),
            "gc_gen12_pauses": len(self.gc_s),
            "gc_max_ms": 1e3 * max(self.gc_s, default=0.0),
        }


def _epp_routers(deployment: str) -> list[Any]:
    from serve_app.llm_router.router_stats import routers

    return [r for r in routers() if r._deployment_id.name == deployment]


def process_state() -> dict[str, Any]:
    """What this process holds after a run: EPP routers alive (of this and earlier runs) and the
    objects the garbage collector tracks (what a full collection walks)."""
    from serve_app.llm_router.router_stats import routers

    gc.collect()  # after the run: count what is alive, not garbage not yet collected
    return {"epp_routers_alive": len(routers()), "gc_tracked_objects": len(gc.get_objects())}


def epp_debug(deployment: str, reset: bool = False) -> dict[str, Any]:
    """The EPP routers of `deployment` in this process: decisions taken before an earlier one was
    routed, and the decision-to-routed delay (then cleared with `reset`)."""
    from serve_app.llm_router.router_stats import percentiles_ms, routers

    epp = [r for r in routers() if r._deployment_id.name == deployment]
    out = {
        "decided_unseen": sum(r.counters.decided_unseen for r in epp),
        "scheduled": sum(r.counters.scheduled for r in epp),
        "routed_not_first": sum(r.counters.routed_not_first for r in epp),
        "first_tokens_inferred": sum(r.counters.first_tokens_inferred for r in epp),
        "routed_after_ms": percentiles_ms([s for r in epp for s in r.counters.routed_after_s]),
        "mirror_lag_ms": percentiles_ms([s for r in epp for s in r.mirror.counters.lag_s]),
    }
    if reset:
        for r in epp:
            r.counters.decided_unseen = r.counters.scheduled = r.counters.routed_not_first = 0
            r.counters.first_tokens_inferred = 0
            r.counters.routed_after_s.clear()
    return out


def quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def run_name(router: str, workload_name: str, replicas: int, tag: str = "") -> str:
    """A deployment (and app) name of its own per run: a handle's process keeps one router per
    deployment name, so a reused name would route every later run with the first run's router
    (and a name deleted and deployed again once left a run's requests waiting forever)."""
    return f"FakeLLM-{workload_name}-{router}-{replicas}" + (f"-{tag}" if tag else "")


def deploy(router: str, workload_name: str, shape: Shape, replicas: int, tag: str = "") -> Any:
    name = run_name(router, workload_name, replicas, tag)
    app = serve.deployment(
        FakeLLMServer,
        name=name,
        num_replicas=replicas,
        max_ongoing_requests=1000,  # Ray Serve LLM's engines queue, not Serve (its default is 1e9)
        ray_actor_options={"num_cpus": 0},
        request_router_config=router_config(router, workload_name),
    ).bind(pod=pod_config(workload_name, shape))
    serve.run(app, name=name, route_prefix=f"/{name}")
    return serve.get_deployment_handle(name, app_name=name)


async def send(handle: Any, requests: list[SimRequest]) -> tuple[list[dict[str, Any]], list[str]]:
    """Each request at its arrival time; the answers (with the caller's TTFT) and the errors."""
    started = time.monotonic()

    async def one(r: SimRequest) -> dict[str, Any]:
        await asyncio.sleep(max(0.0, started + r.arrival_time - time.monotonic()))
        h = handle if r.model == DEFAULT_MODEL else handle.options(multiplexed_model_id=r.model)
        method = h.chat if "messages" in r.body else h.completions
        sent, sent_wall = time.monotonic(), time.time()
        out = await asyncio.wait_for(method.remote(request_model(r.body)), REQUEST_TIMEOUT_S)
        e2e = time.monotonic() - sent
        prompt = r.body.get("prompt") or json.dumps(r.body.get("messages"))
        return {**out, "ttft_client_s": e2e - out["tail_s"], "e2e_s": e2e, "sent": sent, "sent_wall": sent_wall,
                "group": str(prompt)[:GROUP_CHARS]}  # fmt: skip

    outcomes = await asyncio.gather(*(one(r) for r in requests), return_exceptions=True)
    answers = [o for o in outcomes if isinstance(o, dict)]
    errors = [f"{type(o).__name__}: {o}" for o in outcomes if isinstance(o, BaseException)]
    return answers, errors


def choose_times(deployment: str) -> tuple[str, list[float]]:
    """The class of the router that chose for `deployment` in this process and its choose_replicas
    samples, then cleared ("none" when no timed router chose)."""
    from serve_app.llm_router import router as llm_router

    epp = [r for r in llm_router._routers() if r._deployment_id.name == deployment]
    if epp and any(r.counters.choose_s for r in epp):
        samples = [s for r in epp for s in r.counters.choose_s]
        for r in epp:
            r.counters.choose_s.clear()
        return type(epp[0]).__name__, samples
    cls, samples = _samples().get(deployment, ("none", []))
    out = list(samples)
    samples.clear()
    return cls, out


async def run_one(
    router: str, workload_name: str, shape: Shape, replicas: int, seed: int, warmup: int, tag: str = ""
) -> RunResult:
    handle = await asyncio.to_thread(deploy, router, workload_name, shape, replicas, tag)
    try:
        # Warm up on requests of another seed (router start, LoRA loads of Serve's first calls).
        warm = workload(workload_name, Shape(**{**asdict(shape), "requests": warmup}), seed + 1000)[:warmup]
        for r in warm:
            r.arrival_time = 0.0
        await send(handle, warm)
        await asyncio.sleep(2 * STATS_PERIOD_S)
        deployment = run_name(router, workload_name, replicas, tag)
        choose_times(deployment)
        epp_debug(deployment, reset=True)
        _timelines().clear()
        requests = workload(workload_name, shape, seed)
        started = time.monotonic()
        with LoopWatch(_router_loops().get(deployment)) as watch:
            answers, errors = await send(handle, requests)
        wall = time.monotonic() - started
        lines = _timelines()
        traces = {k: v for r in _epp_routers(deployment) for k, v in r.decision_traces.items()}
        for a in answers:
            a["phases"] = phases(a, lines.get(a.get("internal_request_id", "")))
            if traces:
                a["trace"] = traces.get(a.get("internal_request_id", ""))
        lines.clear()
        DETAILS[deployment] = [{k: v for k, v in a.items() if k != "choices"} for a in answers]
        ttft = [a["ttft_client_s"] for a in answers]
        prompt = sum(a["prompt_tokens"] for a in answers)
        cached = sum(a["cached_tokens"] for a in answers)
        routed_by, samples = choose_times(deployment)
        return RunResult(
            workload=workload_name, router=router, replicas=replicas, requests=len(requests), failed=len(errors),
            ttft_p50_ms=1e3 * quantile(ttft, 0.5), ttft_p90_ms=1e3 * quantile(ttft, 0.9),
            engine_ttft_p90_ms=1e3 * quantile([a["ttft_s"] for a in answers], 0.9),
            e2e_p90_ms=1e3 * quantile([a["e2e_s"] for a in answers], 0.9),
            hit_rate=cached / prompt if prompt else 0.0,
            spread=dict(sorted(Counter(f"rank{a['rank']}" for a in answers).items())),
            choose_p50_ms=1e3 * quantile(samples, 0.5) if samples else None,
            choose_p90_ms=1e3 * quantile(samples, 0.9) if samples else None,
            routed_by=routed_by, wall_s=wall, errors=errors[:3],
            diagnosis=diagnose(answers) | watch.summary() | {"phases": breakdown(answers)} | process_state(),
            router_debug=epp_debug(deployment) if router.startswith("epp") else {},
        )  # fmt: skip
    finally:
        await asyncio.to_thread(serve.delete, run_name(router, workload_name, replicas, tag))
        await forget_handle(run_name(router, workload_name, replicas, tag))


async def forget_handle(deployment: str) -> None:
    """Shut down and drop Serve's cached handles of a deleted deployment: the client caches each
    handle it gave out (`ServeControllerClient.handle_cache`), and with it the handle's router, so
    every earlier run's router stayed alive in this process (its state walked by every full garbage
    collection here, the routers' loop shared with the next runs)."""
    from ray.serve.context import _get_global_client

    cache = _get_global_client().handle_cache
    for key in [k for k in cache if k[0] == deployment]:
        await cache.pop(key).shutdown_async()
    gc.collect()  # between runs, not inside one


def stop_epp_actors(workload_name: str) -> None:
    """The router's profile actors are detached and shared by config: a fresh run starts fresh ones.
    `workload_name`: the workload whose config's actors to stop, or a config path."""
    from actors.launcher import stop_router_profile_actors

    config = workload_name if workload_name.endswith(".yaml") else epp_config(workload_name)
    stop_router_profile_actors(read_config(config), namespace=ROUTER_NAMESPACE)


# --- report ----------------------------------------------------------------------------------------


def table(results: list[RunResult]) -> str:
    lines = [
        "| workload | router (class that routed) | TTFT p50 ms | TTFT p90 ms | engine TTFT p90 ms | e2e p90 ms "
        "| prefix hit rate | choose p50 / p90 ms | failed | spread |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        choose = f"{r.choose_p50_ms:.2f} / {r.choose_p90_ms:.2f}" if r.choose_p50_ms is not None else "-"
        lines.append(
            f"| {r.workload} | {r.router} ({r.routed_by}) | {r.ttft_p50_ms:.1f} | {r.ttft_p90_ms:.1f} "
            f"| {r.engine_ttft_p90_ms:.1f} | {r.e2e_p90_ms:.0f} | {r.hit_rate:.1%} | "
            f"{choose} | {r.failed}/{r.requests} | {' '.join(f'{k}:{v}' for k, v in r.spread.items())} |"
        )
    return "\n".join(lines)


def verdict(results: list[RunResult], overhead: list[RunResult]) -> list[str]:
    """The benchmark's two targets, checked on this run's figures."""
    out = []
    for name in ("shared-prefix", "long-prefix"):
        shared = {r.router: r for r in results if r.workload == name}
        if {"epp", "pow2", "prefix-affinity"} <= set(shared):
            best = min(shared["pow2"].ttft_p90_ms, shared["prefix-affinity"].ttft_p90_ms)
            ratio = shared["epp"].ttft_p90_ms / best
            out.append(f"{name} TTFT p90: epp / best of Serve's = {ratio:.2f} (target <= 0.8): "
                       f"{'met' if ratio <= 0.8 else 'MISSED'}")  # fmt: skip
    for r in overhead:
        if r.router == "epp" and r.choose_p50_ms is not None:
            out.append(f"choose_replicas p50 at {r.replicas} replicas: {r.choose_p50_ms:.3f} ms (target <= 1 ms): "
                       f"{'met' if r.choose_p50_ms <= 1.0 else 'MISSED'}")  # fmt: skip
    return out


def start_local_ray(attempts: int = 10) -> None:
    """A local Ray like the tests' (2 CPUs, 127.0.0.1), started so that a busy machine does not
    abort it (`give_agent_ports`), and tried again if it fails all the same."""
    undo = give_agent_ports()
    try:
        _init_with_retries(attempts)
    finally:
        undo()


def give_agent_ports() -> Callable[[], None]:
    """Make this process's next Ray start give its dashboard agent free ports up front; returns
    the undo.

    The raylet waits at most 15 s for the dashboard agent to write the ports it chose, then
    aborts ("timed out during startup"); on a busy 2-core machine the agent's start alone takes
    longer, and with another Ray here it also spends ~8 s retrying its default port 52365. Ports
    given up front are not waited for, and `ray.init` cannot give them: so this does."""
    import socket

    import ray._private.parameter as parameter

    ports = []
    for _ in range(3):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            ports.append(sock.getsockname()[1])
    original = parameter.RayParams.__init__

    def with_agent_ports(self: Any, *args: Any, **kwargs: Any) -> None:
        keys = ("dashboard_agent_listen_port", "metrics_agent_port", "metrics_export_port")
        for key, port in zip(keys, ports, strict=True):
            if kwargs.get(key) is None:
                kwargs[key] = port
        original(self, *args, **kwargs)

    parameter.RayParams.__init__ = with_agent_ports  # type: ignore[method-assign]

    def undo() -> None:
        parameter.RayParams.__init__ = original  # type: ignore[method-assign]

    return undo


def _init_with_retries(attempts: int) -> None:
    for attempt in range(1, attempts + 1):
        try:
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
            return
        except Exception as err:  # "The current node timed out during startup"
            if attempt == attempts:
                raise
            print(f"ray.init failed ({err}); retrying", flush=True)
            time.sleep(5)


async def settle(workload_name: str, shape: Shape, replicas: int, seed: int) -> None:
    """One run not measured before the measured ones, so that the first measured run (`epp`'s in
    the default order) does not also pay for a fresh Ray's first minute (its processes starting,
    Serve's controller busy). Hygiene: its effect could not be told apart from the machine's load
    swings (docs/decisions/0014-serve-router-learns-at-the-decision.md, "Where a request's TTFT goes")."""
    few = Shape(**{**asdict(shape), "requests": min(shape.requests, 48)})
    await run_one("pow2", workload_name, few, replicas, seed + 2000, warmup=4, tag="settle")


async def run_all(args: argparse.Namespace, shape: Shape, routers: list[str]) -> tuple[list[RunResult], ...]:
    results, overhead = [], []
    first = next(w for w in args.workloads.split(",") if w)
    if args.settle:
        await settle(first, shape_for(first, shape), args.replicas, args.seed)
    for name in [w for w in args.workloads.split(",") if w]:
        for router in routers:
            result = await run_one(router, name, shape_for(name, shape), args.replicas, args.seed, args.warmup)
            print(json.dumps(asdict(result)), flush=True)
            results.append(result)
    if args.overhead_replicas:
        few = Shape(**{**asdict(shape), "requests": min(shape.requests, 160)})
        for router in [r for r in args.overhead_routers.split(",") if r]:
            result = await run_one(router, "shared-prefix", few, args.overhead_replicas, args.seed, args.warmup)
            print(json.dumps(asdict(result)), flush=True)
            overhead.append(result)
    # Only now: a deleted deployment's router still talks to its profile actors for a while, and
    # stopping them under it stalled the next runs' routing (seen in a run at 05:27 UTC).
    workloads = [w for w in args.workloads.split(",") if w] + ["shared-prefix"]
    for config in {epp_config(w, r) for w in workloads for r in ("epp", "epp-eta")}:
        await asyncio.to_thread(stop_epp_actors, config)
    return results, overhead


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--overhead-replicas", type=int, default=16, help="0: skip the overhead runs")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--routers", default=",".join(ROUTERS), help=f"of {ROUTERS} and {tuple(EPP_VARIANTS)}")
    ap.add_argument("--overhead-routers", default=",".join(ROUTERS))
    ap.add_argument("--requests", type=int, default=Shape().requests)
    ap.add_argument("--rate", type=float, default=Shape().rate)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=16)
    ap.add_argument("--tiny", action="store_true", help="a smoke-sized run")
    ap.add_argument("--no-settle", dest="settle", action="store_false",
                    help="skip the unmeasured run before the measured ones")  # fmt: skip
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--details", type=Path, help="write every run's answers here (per request)")
    args = ap.parse_args(argv)
    shape = TINY if args.tiny else Shape(requests=args.requests, rate=args.rate)
    routers = [r for r in args.routers.split(",") if r]
    load = os.getloadavg()
    print(f"load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}", flush=True)
    owns_ray = not ray.is_initialized()
    if owns_ray:
        start_local_ray()
    serve.start(http_options={"host": "127.0.0.1", "port": int(os.environ.get("EPP_TEST_PORT", "8000")) + 91})
    try:
        results, overhead = asyncio.run(run_all(args, shape, routers))
    finally:
        if owns_ray:
            serve.shutdown()
            ray.shutdown()
    load = os.getloadavg()
    print(f"load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(table(results))
    if overhead:
        print(f"\nat {args.overhead_replicas} replicas (shared-prefix, {overhead[0].requests} requests):")
        print(table(overhead))
    for line in verdict(results, overhead):
        print(line)
    print("router_stats (this process):", json.dumps(router_stats(), default=str))
    if args.json:
        args.json.write_text(json.dumps({"results": [asdict(r) for r in results],
                                         "overhead": [asdict(r) for r in overhead]}, indent=1))  # fmt: skip
    if args.details:
        args.details.write_text(json.dumps(DETAILS))
    return 0


if __name__ == "__main__":  # run the imported module's main: Serve imports the router classes from it
    from bench.serve_llm_routing import main as imported_main

    raise SystemExit(imported_main())
