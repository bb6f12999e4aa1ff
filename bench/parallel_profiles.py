"""What running a cycle's profiles at the same time buys: decision latency through the profile
actors, one round against several, and against the in-process Scheduler.

    .venv/bin/python -m bench.parallel_profiles [--endpoints 8,64,512] [--decisions 400] [--warmup 100]
                                                [--profiles 1,2,4] [--quick] [--out DIR]

* **P/D** (`ray_epp/configs/pd.yaml`, llm-d's sample): the disagg handler's sequential rounds (decode, then
  prefill when the decider says yes) against `parallelStages: true` (decode and prefill in one
  round, prefill discarded when the decider says no). Three prompt kinds, each a stream of fresh
  requests (bench/scheduler_decision.py's prompt generator and endpoint pools, half the pods
  `prefill`, half `decode`):
  * *short* — 48 bytes (12 tokens, under nonCachedTokens 16): decode-only, and the decider knows it
    before decode runs, so both modes run decode alone;
  * *long* — 8 KB, a shared 6 KB prefix (64 groups) and a unique 2 KB tail: always prefill-decode;
    sequential costs two actor round trips, one round one;
  * *long, cached* — 8 KB prompts that repeat one of 16 documents whole: after the warm-up decode
    holds them, the decider says decode-only, and one round has run prefill in vain.
* **All profiles** (`all-profiles-handler`, 1, 2 and 4 profiles, each prefix-cache-scorer x2,
  queue-scorer, max-score-picker; 8 KB long prompts): the in-process `Scheduler` (the profiles one
  after the other in this process) against the profile actors (all in one round, in parallel).

Both sides of a comparison see the same request stream, interleaved request by request (their
order alternating), so the shared machine's load drifts over both alike; each side keeps its own
plugin state (the actor sets are separate, and decide alike: tests/serve_app/test_pd_one_round_actors.py).
Through the actors means as the gateway schedules: the profile loop here, each profile in its own
`ProfileActor` over `RayProfileRunner` (the same-node channel, batching, PreRequest riding with the
next call, where the actor applies it before that call: its cost is inside the next decision). The
actors are the Serve request router's kind (`start_router_profile_actors`): no datastore, the
endpoints travel with each call (*call pickle* shows what that adds at each size; the gateway's
actors hold a snapshot instead). In-process timings include PreRequest (`Scheduler.schedule`).
Between decisions (untimed) the chosen pod gets busier and another gets fresh metrics.

Writes bench/results/parallel_profiles.json (`_quick` with --quick) and prints Markdown."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pickle
import random
import sys
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

import yaml

from actors.protocol import ProfileCall
from bench.scheduler_decision import Workload, load_feedback, machine, make_endpoints
from scheduler import (
    CycleState,
    Endpoint,
    LLMRequest,
    Scheduler,
    SchedulingError,
    SchedulingResult,
    build_plugins,
    load_config,
    schedule_cycles,
)
from scheduler.loop import CYCLE_SEED_KEY
from scheduler.plugins.filters.roles import ROLE_LABEL
from scheduler.plugins.producers.approx_prefix import ApproxPrefixCacheProducer
from scheduler.plugins.scorers.prefill_backlog import PrefillBacklogScorer
from serve_app.gateway.ray_runner import RayProfileRunner

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "bench" / "results"
PD_CONFIG = ROOT / "ray_epp" / "configs" / "pd.yaml"
NAMESPACE = "ray-epp-parallel-bench"
TIE_SALT = 12345

SEQUENTIAL, ONE_ROUND, IN_PROCESS, ACTORS = "sequential", "one round", "in-process", "actors"
# prompt kind -> (bytes, shared-prefix groups, shared fraction of the prompt)
PROMPTS = {"short": (48, 64, 0.75), "long": (8192, 64, 0.75), "long, cached": (8192, 16, 1.0)}


# --------------------------------------------------------------------------------------------- configs


def pd_config(parallel: bool) -> dict[str, Any]:
    """ray_epp/configs/pd.yaml with the disagg handler's parallelStages set."""
    cfg = yaml.safe_load(PD_CONFIG.read_text())
    for plugin in cfg["plugins"]:
        if plugin["type"] == "disagg-profile-handler":
            plugin.setdefault("parameters", {})["parallelStages"] = parallel
    return cfg


def all_profiles_config(n: int) -> dict[str, Any]:
    """`n` profiles in one round, each scoring by prefix (x2) and queue, then max-score-picker."""
    refs = [
        {"pluginRef": "prefix-cache-scorer", "weight": 2},
        {"pluginRef": "queue-scorer", "weight": 1},
        {"pluginRef": "max-score-picker"},
    ]
    return {
        "apiVersion": "inference.networking.x-k8s.io/v1alpha1",
        "kind": "EndpointPickerConfig",
        "plugins": [
            {"type": "prefix-cache-scorer"},
            {"type": "queue-scorer"},
            {"type": "max-score-picker"},
            {"type": "all-profiles-handler"},
        ],
        "schedulingProfiles": [{"name": f"p{i}", "plugins": refs} for i in range(n)],
    }


def pd_endpoints(n: int, rng: random.Random) -> list[Endpoint]:
    """bench/scheduler_decision.py's pool, half `prefill` and half `decode` pods."""
    endpoints = make_endpoints(n, rng)
    for i, ep in enumerate(endpoints):
        ep.labels[ROLE_LABEL] = "prefill" if i % 2 else "decode"
    return endpoints


# ----------------------------------------------------------------------------------------- the actors


def same_tie_salt(actor: Any) -> int:
    """Run in a profile actor (`__ray_call__`): every picker's tie-break salt set to TIE_SALT, so two
    actor sets break ties alike (otherwise each instance draws its own)."""
    plugins = [p for p in actor.profile.plugins() if hasattr(p, "rng_salt")]
    for plugin in plugins:
        plugin.rng_salt = TIE_SALT
    return len(plugins)


def plugin_state(actor: Any) -> dict[str, Any]:
    """Run in a profile actor: its prefix index (server -> blocks in LRU order) and prefill ledger."""
    state: dict[str, Any] = {}
    for plugin in actor.profile.plugins():
        if isinstance(plugin, ApproxPrefixCacheProducer):
            state["index"] = {name: list(entry.lru) for name, entry in plugin.index._servers.items()}
        elif isinstance(plugin, PrefillBacklogScorer):
            state["ledger"] = dict(plugin.backlog())
    return state


class ActorPath:
    """One config's profile actors and the gateway's way of scheduling through them."""

    def __init__(self, config: dict[str, Any]) -> None:
        import ray

        from actors.launcher import start_router_profile_actors

        self.config = config
        self.actors = start_router_profile_actors(config, namespace=NAMESPACE, options={"push_plugin_metrics": False})
        ray.get([a.__ray_call__.remote(same_tie_salt) for a in self.actors.values()], timeout=120)
        built = build_plugins(load_config(config))
        self.handler = built.handler
        self.profiles = {name: name for name in self.actors}
        self.runner = RayProfileRunner(self.actors, built.body_fields)

    async def schedule(self, request: LLMRequest, endpoints: list[Endpoint], seed: int) -> SchedulingResult:
        state = CycleState()
        state.write(CYCLE_SEED_KEY, seed)
        try:
            result = await schedule_cycles(self.handler, self.profiles, self.runner, request, endpoints, state)
        except SchedulingError:
            self.runner.withdraw(request)  # as the gateway does: the actors take back what they told
            raise
        self.runner.pre_request(request, result)  # rides with the next call, as in the gateway
        return result

    async def calls(self) -> dict[str, int]:
        infos = await asyncio.gather(*(a.info.remote() for a in self.actors.values()))
        return {name: info["calls"] for name, info in zip(self.actors, infos, strict=True)}

    def stop(self) -> None:
        from actors.launcher import stop_router_profile_actors

        stop_router_profile_actors(self.config, namespace=NAMESPACE)


class InProcessPath:
    """The in-process Scheduler: the profiles one after the other, PreRequest included."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.scheduler = Scheduler.from_config(load_config(config))

    async def schedule(self, request: LLMRequest, endpoints: list[Endpoint], seed: int) -> SchedulingResult:
        return self.scheduler.schedule(request, endpoints)  # its own cycle seeds: ties may break otherwise

    def stop(self) -> None:
        pass


# --------------------------------------------------------------------------------------- measuring


def decision(result: SchedulingResult) -> str:
    """What a P/D result did: prefill-decode, decode-only, or a prefill that ran and found no pod."""
    if "prefill" not in result.profile_results:
        return "decode-only"
    return "decode-only (prefill failed)" if result.profile_results["prefill"] is None else "prefill-decode"


def pct_ms(values: list[float], q: float) -> float:
    s = sorted(values)
    return round(s[min(len(s) - 1, int(q * len(s)))] * 1000, 3)


def call_pickle_us(request: LLMRequest, endpoints: list[Endpoint], body_fields: Collection[str]) -> tuple[float, int]:
    """What a call with its endpoints costs to pickle (median µs) and its size in bytes."""
    call = ProfileCall(request.with_body_fields(body_fields), CycleState(), False, endpoints)
    times = []
    for _ in range(21):
        t0 = time.perf_counter()
        data = pickle.dumps(call, protocol=5)
        times.append(time.perf_counter() - t0)
    return round(sorted(times)[10] * 1e6, 1), len(data)


async def compare(
    sides: dict[str, Any], workload: Workload, endpoints: list[Endpoint], rng: random.Random, warmup: int, n: int
) -> dict[str, Any]:
    """The same stream through every side, request by request (the order alternating); per side the
    latency of each measured decision and what it decided; how often the actor sides (whose ties
    break alike) chose differently."""
    names = list(sides)
    compared = [name for name in names if isinstance(sides[name], ActorPath)]
    latencies: dict[str, list[float]] = {name: [] for name in names}
    decisions: dict[str, dict[str, int]] = {name: {} for name in names}
    disagree = errors = 0
    seeds = random.Random(5)
    clock = time.perf_counter
    for i, request in enumerate(workload.requests(warmup + n)):
        seed = seeds.getrandbits(64)
        order = names if i % 2 == 0 else names[::-1]
        targets: dict[str, Any] = {}
        results: dict[str, SchedulingResult] = {}
        for name in order:
            t0 = clock()
            try:
                result = await sides[name].schedule(request, endpoints, seed)
            except SchedulingError:
                targets[name] = None
                errors += 1
                continue
            elapsed = clock() - t0
            results[name] = result
            if i >= warmup:
                latencies[name].append(elapsed)
                label = decision(result)
                decisions[name][label] = decisions[name].get(label, 0) + 1
            targets[name] = {
                k: None if r is None else r.target_endpoints[0].name for k, r in result.profile_results.items()
            }
        disagree += i >= warmup and len({json.dumps(targets.get(n), sort_keys=True) for n in compared}) > 1
        if names[0] in results:
            first = results[names[0]]
            load_feedback(first.profile_results[first.primary_profile_name].target_endpoints[0], endpoints, rng)
    return {
        name: {
            "p50_ms": pct_ms(latencies[name], 0.5),
            "p90_ms": pct_ms(latencies[name], 0.9),
            "p99_ms": pct_ms(latencies[name], 0.99),
            "decisions": decisions[name],
        }
        for name in names
    } | {"disagreements": disagree, "errors": errors}


async def pd_rows(sizes: list[int], decisions: int, warmup: int, seed: int) -> list[dict[str, Any]]:
    """Per pool size one set of actors per mode (and an in-process Scheduler), through the three
    prompt kinds in turn: the prefix index grows over the kinds alike on every side."""
    rows = []
    for n in sizes:
        rng = random.Random(seed)
        endpoints = pd_endpoints(n, rng)
        sides = {SEQUENTIAL: ActorPath(pd_config(False)), ONE_ROUND: ActorPath(pd_config(True))}
        sides[IN_PROCESS] = InProcessPath(pd_config(False))
        try:
            for kind, (size, groups, shared) in PROMPTS.items():
                workload = Workload(rng, size, groups, shared)
                load = os.getloadavg()[0]
                before = {name: await sides[name].calls() for name in (SEQUENTIAL, ONE_ROUND)}
                figures = await compare(sides, workload, endpoints, rng, warmup, decisions)
                after = {name: await sides[name].calls() for name in (SEQUENTIAL, ONE_ROUND)}
                calls = {name: {p: after[name][p] - before[name][p] for p in after[name]} for name in after}
                pickle_us, pickle_bytes = call_pickle_us(
                    next(iter(workload.requests(1))), endpoints, sides[SEQUENTIAL].runner.body_fields
                )
                rows.append({
                    "endpoints": n, "prompt": kind, "prompt_bytes": size, **figures, "actor_calls": calls,
                    "call_pickle_us": pickle_us, "call_bytes": pickle_bytes, "load_average": round(load, 2),
                })  # fmt: skip
                _log(f"pd {n} pods, {kind}: " + ", ".join(f"{k} p50 {figures[k]['p50_ms']} ms" for k in sides))
        finally:
            await drain()
            for side in sides.values():
                side.stop()
    return rows


async def drain() -> None:
    """Let the last PreRequest events leave (they ride alone after notify_delay_s) before the
    actors are stopped."""
    await asyncio.sleep(0.05)


async def all_profiles_rows(
    sizes: list[int], counts: list[int], decisions: int, warmup: int, seed: int
) -> list[dict[str, Any]]:
    rows = []
    size, groups, shared = PROMPTS["long"]
    for n in sizes:
        for k in counts:
            rng = random.Random(seed)
            endpoints = make_endpoints(n, rng)
            workload = Workload(rng, size, groups, shared)
            sides = {IN_PROCESS: InProcessPath(all_profiles_config(k)), ACTORS: ActorPath(all_profiles_config(k))}
            try:
                load = os.getloadavg()[0]
                figures = await compare(sides, workload, endpoints, rng, warmup, decisions)
            finally:
                await drain()
                for side in sides.values():
                    side.stop()
            rows.append({"endpoints": n, "profiles": k, **figures, "load_average": round(load, 2)})
            _log(
                f"all-profiles {n} pods, {k} profiles: "
                + ", ".join(f"{s} p50 {figures[s]['p50_ms']} ms" for s in sides)
            )
    return rows


# --------------------------------------------------------------------------------------------- report


def _cell(side: dict[str, Any]) -> str:
    return f"{side['p50_ms']:.2f} / {side['p99_ms']:.2f}"


def markdown(result: dict[str, Any]) -> str:
    a = result["args"]
    out = [
        f"machine: {result['machine']}; load average at start {result['load_average_at_start']}, "
        f"at end {result['load_average_at_end']}; {a['decisions']} decisions per row after {a['warmup']} warm-up. "
        "Latencies in ms, p50 / p99.",
        "",
        "**P/D (ray_epp/configs/pd.yaml), through the profile actors: sequential rounds vs one round**",
        "",
        "| pods | prompt | decisions | sequential | one round | one round - sequential (p50) | in-process "
        "| prefill runs seq / one round (warm-up incl.) | call pickle | load |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["pd"]:
        seq, one = r[SEQUENTIAL], r[ONE_ROUND]
        d = ", ".join(f"{k} {v}" for k, v in sorted(seq["decisions"].items()))
        calls = r["actor_calls"]
        runs = f"{calls[SEQUENTIAL].get('prefill', 0)} / {calls[ONE_ROUND].get('prefill', 0)}"
        agree = "" if not r["disagreements"] else f" ({r['disagreements']} differ)"
        out.append(
            f"| {r['endpoints']} | {r['prompt']} | {d}{agree} | {_cell(seq)} | {_cell(one)} "
            f"| {one['p50_ms'] - seq['p50_ms']:+.2f} | {_cell(r[IN_PROCESS])} | {runs} "
            f"| {r['call_pickle_us']:.0f} µs, {r['call_bytes'] / 1024:.0f} KB | {r['load_average']} |"
        )
    out += [
        "",
        "**All profiles in one round (all-profiles-handler, prefix x2 + queue, 8 KB prompts): in-process "
        "(one after the other) vs profile actors (in parallel)**",
        "",
        "| pods | profiles | in-process | actors | actors - in-process (p50) | load |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["all_profiles"]:
        ip, ac = r[IN_PROCESS], r[ACTORS]
        out.append(
            f"| {r['endpoints']} | {r['profiles']} | {_cell(ip)} | {_cell(ac)} | {ac['p50_ms'] - ip['p50_ms']:+.2f} "
            f"| {r['load_average']} |"
        )
    return "\n".join(out) + "\n"


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> dict[str, Any]:
    import ray

    from bench.runner import _meta

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(num_cpus=os.cpu_count() or 2, include_dashboard=False, log_to_driver=False,
                 _node_ip_address="127.0.0.1", namespace=NAMESPACE)  # fmt: skip
    sizes = [int(x) for x in args.endpoints.split(",")]
    counts = [int(x) for x in args.profiles.split(",")]
    load_start = [round(x, 2) for x in os.getloadavg()]
    try:
        pd = asyncio.run(pd_rows(sizes, args.decisions, args.warmup, args.seed))
        every = asyncio.run(all_profiles_rows(sizes, counts, args.decisions, args.warmup, args.seed))
    finally:
        if started_ray:
            ray.shutdown()
    return {
        "benchmark": "parallel-profiles",
        "machine": machine(),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "load_average_at_start": load_start,
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        "pd": pd,
        "all_profiles": every,
        "meta": _meta(" ".join(["python -m bench.parallel_profiles", *(args.argv or [])])),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.parallel_profiles", description=__doc__.split("\n\n")[0])
    p.add_argument("--endpoints", default="8,64,512", help="comma-separated pool sizes")
    p.add_argument("--profiles", default="1,2,4", help="all-profiles-handler: profiles per round")
    p.add_argument("--decisions", type=int, default=400, help="measured decisions per row and side")
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="8 pods, 1 and 2 profiles, a few decisions (a smoke run)")
    p.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.quick:
        args.endpoints, args.profiles, args.decisions, args.warmup = "8", "1,2", 6, 3
    result = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / ("parallel_profiles_quick.json" if args.quick else "parallel_profiles.json")
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(markdown(result))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
