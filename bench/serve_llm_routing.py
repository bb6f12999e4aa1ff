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
time `choose_replicas` and stamp each request's steps in the router (nothing else changes:
bench/serve_llm_timed_routers.py), so every request's TTFT splits into phases (`phases`, with the
rest of what a run measures in bench/serve_llm_measures.py). One unmeasured run comes first (`settle`).

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
import json
import os
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

import ray
from ray import serve

from bench.local_ray import start_local_ray
from bench.serve_llm_measures import (
    LoopWatch,
    RunResult,
    breakdown,
    choose_times,
    diagnose,
    epp_debug,
    epp_routers,
    phases,
    process_state,
    quantile,
)
from bench.serve_llm_replica import FakeLLMServer, request_model
from bench.serve_llm_timed_routers import (
    EPP_VARIANTS,
    ROUTERS,
    STATS_PERIOD_S,
    epp_config,
    request_timelines,
    router_config,
    router_loops,
)
from bench.serve_llm_workloads import TINY, WORKLOADS, Shape, pod_config, shape_for, workload
from ray_epp.simulator import DEFAULT_MODEL, SimRequest
from serve_app.llm_router.router import ROUTER_NAMESPACE, read_config, router_stats

GROUP_CHARS = 200  # a prompt's first characters name its shared-prefix group
REQUEST_TIMEOUT_S = 120.0  # a request not answered by then is an error of the run, not a hang of the benchmark
DETAILS: dict[str, list[dict[str, Any]]] = {}  # run name -> its answers (`--details`)


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
        request_timelines().clear()
        requests = workload(workload_name, shape, seed)
        started = time.monotonic()
        with LoopWatch(router_loops().get(deployment)) as watch:
            answers, errors = await send(handle, requests)
        wall = time.monotonic() - started
        lines = request_timelines()
        traces = {k: v for r in epp_routers(deployment) for k, v in r.decision_traces.items()}
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


if __name__ == "__main__":
    raise SystemExit(main())
