"""Our same-node channel (actors/channel.py) against Ray's own ways to call an actor, in one run.

    .venv/bin/python -m bench.channel_vs_ray                      # ~1-2 minutes on 2 cores
    .venv/bin/python -m bench.channel_vs_ray --calls 100 --rounds 1 --no-probes

Set-up: a local Ray (2 CPUs, no dashboard). A *caller* actor (async, as a Serve replica is) calls a
*callee* actor (async, as a ProfileActor is) on the same node with `run_batch(items)`: a list of 1
or 8 `ProfileCall`s, each carrying a real `LLMRequest` with a ~2 KB prompt; the callee answers with
as many `ProfileOutcome`s (a target endpoint with its attributes). The callee does no scheduling
work, so the figures are the transport's. Candidates:

* `channel` — our loopback socket: `ChannelClient.request` → `ChannelServer` → the actor's loop.
* `ray-call` — a plain async Ray actor call, `await callee.run_batch.remote(items)` (our fallback).
* `cgraph` — a Ray Compiled Graph (`ray.dag`, `experimental_compile(enable_asyncio=True)`,
  shared-memory channels), `await (await dag.execute_async(items))`. A graph runs its method on
  a thread of its own, so the method hands the batch to the actor's event loop (where the
  ProfileActor's plugins and snapshot live) and waits — what the ProfileActor would have to do.
* `cgraph-thread` — the same graph with the work done on the graph's thread: Ray's best case,
  not usable as is by the ProfileActor (its state would then be touched from two threads).

A compiled graph burns CPU while it waits (its readers poll), and an actor runs one graph at a time,
so each candidate is set up, measured on every scenario, and torn down before the next; `--rounds`
repeats the whole in a rotated order. A graph needs `_max_inflight_executions` at least the caller's
concurrency (at its default of 10, a 32-wide caller gets RayCgraphCapacityExceeded, not a queue), so
it is compiled with 64. Measured per candidate and scenario (batch 1 or 8; sequential, concurrency 8
and 32): round-trip p50/p99 in the caller, calls/s, and CPU ms per call of caller + callee.

Then, unless `--no-probes`, what matters for using a compiled graph from the gateway: the caller's
event-loop stall while compiling, the CPU an idle graph burns, whether a second caller (another
gateway replica) can drive its own graph to the same callee, and what a graph does when its
callee is killed and restarted by Ray.

Writes bench/results/channel_vs_ray.json (or --out) and prints Markdown tables."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from actors.channel import ChannelClient, ChannelServer
from actors.protocol import ProfileCall, ProfileOutcome
from scheduler import CycleState, Endpoint, LLMRequest, Metrics, ProfileRunResult

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
CANDIDATES = ("channel", "ray-call", "cgraph", "cgraph-thread")
GRAPH_CANDIDATES = ("cgraph", "cgraph-thread")
BATCHES = (1, 8)
CONCURRENCY = (1, 8, 32)
MAX_INFLIGHT = 64
RULE = 1.20  # keep Ray's facility if its latency is within 20% of the channel's


# --- payloads -------------------------------------------------------------------------------------


def make_batch(n: int, prompt_chars: int = 2000) -> list[ProfileCall]:
    """n ProfileCalls as the gateway sends them: a completions request with a ~2 KB prompt."""
    words = "the quick brown fox jumps over the lazy dog and keeps running through the field "
    calls = []
    for i in range(n):
        prompt = (f"request {i}: " + words * (prompt_chars // len(words) + 1))[:prompt_chars]
        body = {"model": "base", "prompt": prompt, "max_tokens": 128, "temperature": 0.7, "stream": True}
        headers = {"content-type": "application/json", "x-request-id": f"req-{i}"}
        calls.append(ProfileCall(LLMRequest(f"req-{i}", "base", body, headers), CycleState(), False))
    return calls


def make_outcomes(n: int) -> list[ProfileOutcome]:
    """n answers as a profile actor gives them: one target endpoint carrying its prefix match."""
    now = time.time()
    outcomes = []
    for i in range(n):
        metrics = Metrics(waiting_queue_size=2, running_requests_size=7, kv_cache_usage_percent=0.41,
                          active_models={"base": 0}, max_active_models=4, cache_block_size=16,
                          cache_num_blocks=27000)  # fmt: skip
        target = Endpoint(f"pod-{i % 4}", "127.0.0.1", 8000 + i % 4, {"llm-d.ai/role": "decode"}, metrics,
                          {"prefix-cache-match": 0.75})  # fmt: skip
        outcomes.append(ProfileOutcome(ProfileRunResult([target]), None, None, 1_700_000_000_000_000, now, now))
    return outcomes


# --- the two actors -------------------------------------------------------------------------------


@ray.remote(num_cpus=0, max_restarts=-1)
class Callee:
    """Stands in for a ProfileActor: an async actor that answers run_batch on its event loop, also
    over our channel, and has the two methods a compiled graph can bind."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._answers = {n: make_outcomes(n) for n in BATCHES}
        self._channel = ChannelServer(self.run_batch)
        self._channel_started = self._loop.create_task(self._channel.start())
        self.calls = 0

    def _answer(self, items: list[ProfileCall]) -> list[ProfileOutcome]:
        if not all(isinstance(c, ProfileCall) and len(c.request.body["prompt"]) > 1000 for c in items):
            raise TypeError("the batch did not arrive intact")
        self.calls += 1
        return self._answers.get(len(items)) or make_outcomes(len(items))

    async def run_batch(self, items: list[ProfileCall]) -> list[ProfileOutcome]:
        return self._answer(items)

    def run_batch_on_loop(self, items: list[ProfileCall]) -> list[ProfileOutcome]:
        """For a compiled graph, which calls from its own thread: run on the actor's loop, wait."""
        return asyncio.run_coroutine_threadsafe(self.run_batch(items), self._loop).result()

    def run_batch_on_graph_thread(self, items: list[ProfileCall]) -> list[ProfileOutcome]:
        return self._answer(items)

    async def channel_endpoint(self) -> tuple[int, bytes]:
        await self._channel_started
        return self._channel.port, self._channel.token

    def pid(self) -> int:
        return os.getpid()


@ray.remote(num_cpus=0)
class Caller:
    """Stands in for a gateway replica: an async actor that sends the batches and times them."""

    def __init__(self, callee: Any) -> None:
        self.callee = callee
        self.batches = {n: make_batch(n) for n in BATCHES}
        self.client: ChannelClient | None = None
        self.dag: Any = None
        self.candidate = ""

    def pid(self) -> int:
        return os.getpid()

    async def setup(self, candidate: str, max_inflight: int = MAX_INFLIGHT) -> dict[str, float]:
        """Connect or compile; returns how long that took and the longest stall of this event loop."""
        self.candidate = candidate
        stalls: list[float] = []
        ticker = asyncio.get_running_loop().create_task(_tick(stalls))
        await asyncio.sleep(0.02)
        started = time.perf_counter()
        if candidate == "channel":
            port, token = await self.callee.channel_endpoint.remote()
            self.client = ChannelClient(port, token)
            await self.client.connect()
        elif candidate in GRAPH_CANDIDATES:
            from ray.dag import InputNode

            method = "run_batch_on_loop" if candidate == "cgraph" else "run_batch_on_graph_thread"
            with InputNode() as inp:
                node = getattr(self.callee, method).bind(inp)
            # experimental_compile is synchronous (ray.get inside) and must run on this loop's
            # thread when enable_asyncio=True, so it stalls the loop for as long as it takes.
            self.dag = node.experimental_compile(enable_asyncio=True, _max_inflight_executions=max_inflight)
        elif candidate != "ray-call":
            raise ValueError(f"unknown candidate {candidate!r}; known: {CANDIDATES}")
        took = time.perf_counter() - started
        await asyncio.sleep(0.02)
        ticker.cancel()
        return {"setup_s": took, "max_loop_stall_s": max(stalls, default=0.0)}

    async def call(self, items: list[ProfileCall], timeout: float = 30.0) -> list[ProfileOutcome]:
        if self.candidate == "channel":
            assert self.client is not None
            return await asyncio.wait_for(self.client.request(items), timeout)
        if self.candidate == "ray-call":
            return await asyncio.wait_for(self.callee.run_batch.remote(items), timeout)
        fut = await self.dag.execute_async(items)
        return await asyncio.wait_for(fut, timeout)

    async def measure(self, batch: int, concurrency: int, calls: int, warmup: int) -> dict[str, Any]:
        """`concurrency` coroutines each make `calls` round trips; latencies in seconds."""
        items = self.batches[batch]
        for _ in range(warmup):
            await self.call(items)
        latencies: list[float] = []

        async def worker() -> None:
            for _ in range(calls):
                t0 = time.perf_counter()
                answer = await self.call(items)
                latencies.append(time.perf_counter() - t0)
                if len(answer) != batch:
                    raise RuntimeError(f"{len(answer)} answers for a batch of {batch}")

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return {"latencies": latencies, "wall_s": time.perf_counter() - started}

    async def try_call(self, timeout: float) -> str:
        """One call, described: 'ok in N ms' or the error's type and message."""
        t0 = time.perf_counter()
        try:
            await self.call(self.batches[1], timeout)
            return f"ok in {(time.perf_counter() - t0) * 1e3:.1f} ms"
        except BaseException as err:  # the probe reports whatever happens
            kind = "timeout" if isinstance(err, asyncio.TimeoutError) else type(err).__name__
            first_line = str(err).splitlines()[0][:120] if str(err) else ""
            return f"{kind} after {time.perf_counter() - t0:.1f} s: {first_line}"

    async def teardown(self) -> None:
        if self.client is not None:
            await self.client.close()
            self.client = None
        if self.dag is not None:
            dag, self.dag = self.dag, None
            await asyncio.to_thread(dag.teardown)


async def _tick(stalls: list[float]) -> None:
    last = time.perf_counter()
    while True:
        await asyncio.sleep(0.001)
        now = time.perf_counter()
        stalls.append(now - last)
        last = now


# --- the run --------------------------------------------------------------------------------------


@dataclass(slots=True)
class Cell:
    latencies: list[float]
    wall_s: float = 0.0
    cpu_s: float = 0.0
    calls: int = 0


def _cpu(pids: list[int]) -> float:
    import psutil

    total = 0.0
    for pid in pids:
        t = psutil.Process(pid).cpu_times()
        total += t.user + t.system
    return total


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_benchmark(
    calls: int = 300,
    rounds: int = 2,
    candidates: tuple[str, ...] = CANDIDATES,
    batches: tuple[int, ...] = BATCHES,
    concurrency: tuple[int, ...] = CONCURRENCY,
    warmup: int = 20,
    probes: bool = True,
) -> dict[str, Any]:
    """Measure every candidate on every (batch, concurrency) scenario; Ray must be initialised.
    At concurrency c each of the c coroutines makes max(calls // c, 10) calls (so ~`calls` in all)."""
    callee = Callee.remote()
    caller = Caller.remote(callee)
    pids = ray.get([caller.pid.remote(), callee.pid.remote()])
    cells: dict[tuple[str, int, int], Cell] = {}
    setups: dict[str, list[dict[str, float]]] = {c: [] for c in candidates}
    try:
        for r in range(rounds):
            order = candidates[r % len(candidates) :] + candidates[: r % len(candidates)]
            for cand in order:
                setups[cand].append(ray.get(caller.setup.remote(cand)))
                for batch in batches:
                    for conc in concurrency:
                        per_worker = max(calls // conc, 10)
                        cpu0 = _cpu(pids)
                        out = ray.get(caller.measure.remote(batch, conc, per_worker, warmup))
                        cpu1 = _cpu(pids)
                        cell = cells.setdefault((cand, batch, conc), Cell([]))
                        cell.latencies += out["latencies"]
                        cell.wall_s += out["wall_s"]
                        cell.cpu_s += cpu1 - cpu0  # includes the warm-up calls, counted below
                        cell.calls += len(out["latencies"]) + warmup
                ray.get(caller.teardown.remote())
    finally:
        for actor in (caller, callee):
            ray.kill(actor)
    rows = []
    for (cand, batch, conc), cell in cells.items():
        rows.append({
            "candidate": cand, "batch": batch, "concurrency": conc, "calls": len(cell.latencies),
            "p50_ms": statistics.median(cell.latencies) * 1e3, "p99_ms": _pct(cell.latencies, 0.99) * 1e3,
            "calls_per_s": len(cell.latencies) / cell.wall_s if cell.wall_s else 0.0,
            "cpu_ms_per_call": cell.cpu_s / cell.calls * 1e3 if cell.calls else 0.0,
        })  # fmt: skip
    result: dict[str, Any] = {
        "rows": rows,
        "setup": {c: s for c, s in setups.items() if s},
        "verdict": verdict(rows),
        "load_average": os.getloadavg(),
    }
    if probes:
        result["probes"] = probe_graph_constraints()
    return result


def verdict(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per scenario: the best Ray candidate's p50 against the channel's, and the 20% rule."""
    out = []
    by_key = {(r["candidate"], r["batch"], r["concurrency"]): r for r in rows}
    for (cand, batch, conc), row in sorted(by_key.items(), key=lambda kv: (kv[0][1], kv[0][2])):
        if cand != "channel":
            continue
        ray_rows = [r for (c, b, k), r in by_key.items() if c != "channel" and (b, k) == (batch, conc)]
        if not ray_rows:
            continue
        best = min(ray_rows, key=lambda r: r["p50_ms"])
        ratio = best["p50_ms"] / row["p50_ms"]
        out.append({"batch": batch, "concurrency": conc, "channel_p50_ms": row["p50_ms"],
                    "best_ray": best["candidate"], "best_ray_p50_ms": best["p50_ms"], "ratio": ratio,
                    "within_20pct": ratio <= RULE})  # fmt: skip
    return out


def probe_graph_constraints(timeout_s: float = 5.0, idle_s: float = 3.0) -> dict[str, Any]:
    """What a compiled graph does in the situations the gateway meets; each probe on fresh actors.
    `timeout_s` bounds each probing call, `idle_s` each idle-CPU sample."""
    probes: dict[str, Any] = {}
    # Idle CPU: a live graph with no calls, caller + callee, CPU seconds per second.
    callee = Callee.remote()
    caller = Caller.remote(callee)
    pids = ray.get([caller.pid.remote(), callee.pid.remote()])
    cpu0 = _cpu(pids)
    time.sleep(idle_s)
    probes["idle_cpu_no_graph"] = (_cpu(pids) - cpu0) / idle_s
    probes["compile"] = ray.get(caller.setup.remote("cgraph"))
    ray.get(caller.try_call.remote(timeout_s))
    cpu0 = _cpu(pids)
    time.sleep(idle_s)
    probes["idle_cpu_with_graph"] = (_cpu(pids) - cpu0) / idle_s
    # A second caller (another gateway replica) compiles its own graph to the same callee.
    caller2 = Caller.remote(callee)
    probes["second_caller_compile"] = ray.get(caller2.setup.remote("cgraph"))
    probes["second_caller_call"] = ray.get(caller2.try_call.remote(timeout_s))
    probes["first_caller_call_meanwhile"] = ray.get(caller.try_call.remote(timeout_s))
    ray.kill(caller2)
    ray.kill(caller)
    ray.kill(callee)
    # The callee dies and Ray restarts it (max_restarts=-1): does the graph carry on?
    callee = Callee.remote()
    caller = Caller.remote(callee)
    ray.get(caller.setup.remote("cgraph"))
    probes["before_restart"] = ray.get(caller.try_call.remote(timeout_s))
    old_pid = ray.get(callee.pid.remote())
    os.kill(old_pid, 9)
    new_pid = _wait_restarted(callee, old_pid, 30.0)
    probes["callee_restarted"] = new_pid is not None
    probes["after_restart"] = ray.get(caller.try_call.remote(timeout_s))
    probes["after_restart_again"] = ray.get(caller.try_call.remote(timeout_s))
    caller3 = Caller.remote(callee)
    probes["new_graph_after_restart"] = ray.get(caller3.setup.remote("cgraph"))
    probes["new_graph_call"] = ray.get(caller3.try_call.remote(timeout_s))
    for actor in (caller3, caller, callee):
        ray.kill(actor)
    return probes


def _wait_restarted(callee: Any, old_pid: int, timeout_s: float) -> int | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ref = callee.pid.remote()
        ready, _ = ray.wait([ref], timeout=2.0)
        if ready:
            try:
                pid = ray.get(ref)
                if pid != old_pid:
                    return pid
            except Exception:  # still restarting
                pass
        time.sleep(0.2)
    return None


# --- report ---------------------------------------------------------------------------------------


def markdown(result: dict[str, Any]) -> str:
    lines = ["| candidate | batch | concurrency | p50 | p99 | calls/s | CPU ms/call |", "|---|---|---|---|---|---|---|"]
    for r in sorted(result["rows"], key=lambda r: (r["batch"], r["concurrency"], CANDIDATES.index(r["candidate"]))):
        lines.append(f"| {r['candidate']} | {r['batch']} | {r['concurrency']} | {r['p50_ms']:.2f} ms | "
                     f"{r['p99_ms']:.2f} ms | {r['calls_per_s']:.0f} | {r['cpu_ms_per_call']:.2f} |")  # fmt: skip
    if result["verdict"]:
        lines += ["", "| batch | concurrency | channel p50 | best Ray | its p50 | ratio | within 20% |",
                  "|---|---|---|---|---|---|---|"]  # fmt: skip
        for v in result["verdict"]:
            within = "yes" if v["within_20pct"] else "no"
            lines.append(f"| {v['batch']} | {v['concurrency']} | {v['channel_p50_ms']:.2f} ms | {v['best_ray']} | "
                         f"{v['best_ray_p50_ms']:.2f} ms | {v['ratio']:.2f} | {within} |")  # fmt: skip
    if result.get("setup"):
        lines.append("")
        for cand, setups in result["setup"].items():
            took = ", ".join(f"{s['setup_s'] * 1e3:.0f} ms (loop stall {s['max_loop_stall_s'] * 1e3:.0f} ms)"
                             for s in setups)  # fmt: skip
            lines.append(f"* setup of {cand}: {took}")
    for key, value in (result.get("probes") or {}).items():
        lines.append(f"* probe {key}: {value}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300, help="round trips per candidate, scenario and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--candidates", nargs="+", default=list(CANDIDATES), choices=CANDIDATES)
    parser.add_argument("--no-probes", action="store_true", help="skip the compiled-graph constraint probes")
    parser.add_argument("--out", type=Path, default=RESULTS / "channel_vs_ray.json")
    args = parser.parse_args(argv)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    started = time.monotonic()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    try:
        result = run_benchmark(args.calls, args.rounds, tuple(args.candidates), probes=not args.no_probes)
    finally:
        ray.shutdown()
    result["command"] = " ".join(["python -m bench.channel_vs_ray", *(argv if argv is not None else sys.argv[1:])])
    result["seconds"] = time.monotonic() - started
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=str))
    print(markdown(result))
    print(f"\n{result['seconds']:.0f} s; load average {result['load_average']}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
