"""Soak: the whole product under steady load for a long time, with a fault every few minutes, to
show that nothing leaks and every fault costs a bounded number of requests.

What runs (all on 127.0.0.1): `EppDeployment` (serve_app/cli/launch.py) with 2 gateway replicas on one
port, in front of simulated vLLM pods, each pod in its own process (so one can be SIGKILLed and
started again on its port). The load is open-loop (Poisson arrivals) at `--load` (default 0.7) of the
capacity measured first (a closed loop at twice the pods' batch slots; the simulator's engine model
gives the ceiling it is compared with), half the requests streamed. Every
`--fault-every` seconds one fault, in turn: a pod process killed and started again `--pod-down`
seconds later, the datastore actor killed, a metrics actor killed, a profile actor killed, a gateway
replica killed (Ray restarts the actors; Serve replaces the replica), with `--nodes` a Ray node
lost (bench/soak_nodes.py), a pod hung (SIGSTOP for
`--hang` seconds, then SIGCONT) and, with `--kv-events` (pods publish vLLM KV events, the profile
actor follows them with bench/configs/precise.yaml), a pod's KV-event publisher restarted (its
process killed and started again at once on the same ports). Half the prompts (`--shared-prefix`)
start with one of 8 shared system prompts; the rest are unique throughout.

Sampled every `--sample-every` seconds: the RSS (and USS) of every process under the driver: Ray's
own (gcs_server, raylet, the dashboard and runtime-env agents, the monitors), our actors and
replicas (by their `ray::` process titles), the pods, and the driver; the entries of each profile
actor's prefix index and in-flight ledgers
(ProfileActor.info()["state_sizes"]), the metrics hub's sources and series (MetricsHub.sizes()).
With `--tracemalloc`, also the allocation sites that grew in the default profile's actor
(bench/soak_tracemalloc.py): a diagnosis run, since tracing slows that actor.

    .venv/bin/python -m bench.soak --minutes 30 [--port 25000] [--out bench/results/soak]

Writes <out>.json, <out>.png (RSS and structure sizes over time, faults marked), and the two small
figures docs/RELIABILITY.md shows, <out>_rss.png and <out>_errors.png, with the profile actors' RSS
over their index sizes, <out>_profile_actors.png. A benchmark,
not a test (tests/bench/test_soak.py runs it tiny so it cannot rot). The faults:
bench/soak_faults.py; the sampling and its summaries: bench/soak_sampling.py; the report:
bench/soak_report.py; the figures:
bench/soak_plots.py."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.e2e import _free_port
from bench.gateway_overhead import ROOT, _wait_http
from bench.soak_faults import FAULTS, Fault, SoakFaults
from bench.soak_plots import plot, plot_profile_actors, plot_small
from bench.soak_report import SoakReport
from bench.soak_sampling import SoakSampling, print_summary
from bench.soak_tracemalloc import TracemallocProbe

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo", "lima")


@dataclass(slots=True)
class SoakConfig:
    minutes: float = 30.0
    load: float = 0.7  # fraction of the measured capacity
    pods: int = 4
    max_num_seqs: int = 2  # small batches, so the pods (not this 2-core machine's gateway) set capacity
    max_tokens: int = 48
    prompt_chars: int = 1000  # ~250 tokens, ~15 prefix blocks a request: the index fills in minutes
    # The share of requests whose prompt starts with one of `shared_prefixes` system prompts of
    # `shared_prefix_chars` (the rest of the prompt unique); the others are unique throughout.
    shared_prefix: float = 0.5
    shared_prefixes: int = 8
    shared_prefix_chars: int = 700
    # Pods publish vLLM KV events and the profile actor follows them (bench/configs/precise.yaml with
    # a token producer on a small tokenizer): the `kv-publisher` fault restarts a pod's publisher.
    kv_events: bool = False
    hang_s: float = 40.0  # a hung pod is SIGSTOPped this long (past first_byte_timeout_s, 30 s)
    replicas: int = 2
    port: int = 25000
    fault_every_s: float = 180.0
    pod_down_s: float = 10.0
    sample_every_s: float = 10.0
    capacity_s: float = 20.0  # 0: take the engine model's capacity, do not measure
    request_timeout_s: float = 30.0
    max_outstanding: int = 512
    faults: tuple[str, ...] = FAULTS
    seed: int = 13
    # 0: one local Ray, as `epp up` starts it; N: a head running no actor and N worker nodes
    # (bench/soak_nodes.py), with profile standbys, and the `node` fault
    nodes: int = 0
    # Trace the default profile's first actor's allocations (bench/soak_tracemalloc.py): a diagnosis
    # of what grows, which slows that actor; not for a run whose figures are reported.
    tracemalloc: bool = False


@dataclass(slots=True)
class Result:
    t: float  # seconds since the load started, at send
    status: int  # HTTP status; 0 = no answer (connection refused, broken, timed out)
    latency_s: float
    error: str = ""


@dataclass
class Soak(SoakFaults, SoakSampling, SoakReport):
    cfg: SoakConfig
    tmp: Path
    pod_procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    pod_ports: dict[str, int] = field(default_factory=dict)
    kv_ports: dict[str, int] = field(default_factory=dict)
    tokenizer: str = ""
    results: list[Result] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    t0: float = 0.0
    outstanding: int = 0
    skipped: int = 0  # arrivals not sent because max_outstanding were in flight
    dep: Any = None
    cluster: Any = None  # bench/soak_nodes.SoakCluster with `nodes`
    probe: TracemallocProbe | None = None  # with `tracemalloc`

    # --- pods: one process each --------------------------------------------------------------

    def _pod_config(self, name: str) -> dict[str, Any]:
        from ray_epp.simulator import PodConfig

        cfg = PodConfig(name=name, max_num_seqs=self.cfg.max_num_seqs, default_max_tokens=self.cfg.max_tokens)
        if self.cfg.kv_events:  # the same PUB port after a restart, as a pod's Service keeps it
            port = self.kv_ports.setdefault(name, _free_port())
            cfg = cfg.model_copy(update={"kv_events": True, "kv_events_port": port, "tokenizer": self.tokenizer})
        return cfg.model_dump(mode="json")

    def start_pod(self, name: str) -> None:
        config = self.tmp / f"{name}.json"
        config.write_text(json.dumps([self._pod_config(name)]))
        port = self.pod_ports.setdefault(name, _free_port())
        cmd = [sys.executable, "-m", "ray_epp.simulator", "--config", str(config), "--base-port", str(port)]
        log = open(self.tmp / f"{name}.log", "a")  # noqa: SIM115 - the process keeps it
        self.pod_procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        _wait_http(f"http://127.0.0.1:{port}/health", 60)

    def stop_pods(self) -> None:
        for proc in self.pod_procs.values():
            with contextlib.suppress(ProcessLookupError):
                proc.terminate()
        for proc in self.pod_procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
            if proc.poll() is None:
                proc.kill()

    # --- the deployment ----------------------------------------------------------------------

    def start(self) -> None:
        from actors.launcher import PodSpec
        from serve_app.cli.launch import EppDeployment, LaunchSpec

        names = [f"soak-{i}" for i in range(self.cfg.pods)]
        config: dict[str, Any] | None = None
        if self.cfg.kv_events:
            from bench.precise_routing import precise_config
            from bench.tokenizer_fixture import make_tokenizer

            self.tokenizer = str(make_tokenizer(self.tmp))
            config = precise_config(self.tokenizer)
        for name in names:
            self.start_pod(name)
        pods = [
            PodSpec(name=n, address="127.0.0.1", port=self.pod_ports[n],
                    **({"kvEvents": {"endpoint": f"tcp://127.0.0.1:{self.kv_ports[n]}"}} if self.cfg.kv_events else {}))
            for n in names
        ]  # fmt: skip
        address, actor_options = None, None
        if self.cfg.nodes:
            from bench.soak_nodes import WORKER_ROLE, SoakCluster

            self.cluster = SoakCluster(self.cfg)
            address = self.cluster.start()
            actor_options = {"datastore_node_labels": WORKER_ROLE}
        spec = LaunchSpec(pods=pods, port=self.cfg.port, replicas=self.cfg.replicas, config=config, address=address,
                          actor_options=actor_options)  # fmt: skip
        self.dep = EppDeployment.start(spec)
        if self.cfg.tracemalloc:
            self.probe = TracemallocProbe()

    def stop(self) -> None:
        try:
            if self.dep is not None:
                self.dep.stop()
            self.stop_pods()
        finally:
            if self.cluster is not None:
                self.cluster.stop()

    # --- load ----------------------------------------------------------------------------------

    def body(self, n: int, stream: bool) -> dict[str, Any]:
        """Request n's body: a unique prompt, or (a `shared_prefix` share) one of the shared system
        prompts followed by a unique question, `prompt_chars` long either way."""
        rng = random.Random(self.cfg.seed * 1_000_003 + n)
        words: list[str] = []
        if rng.random() < self.cfg.shared_prefix:
            words.append(shared_prompt(rng.randrange(self.cfg.shared_prefixes), self.cfg.shared_prefix_chars))
        words.append(f"request {n} {rng.getrandbits(64):016x}:")
        size = sum(len(w) + 1 for w in words)
        while size < self.cfg.prompt_chars:
            w = rng.choice(WORDS)
            words.append(w)
            size += len(w) + 1
        body: dict[str, Any] = {"model": MODEL, "prompt": " ".join(words), "max_tokens": self.cfg.max_tokens}
        body["ignore_eos"] = True
        if stream:
            body["stream"] = True
        return body

    async def one(self, session: aiohttp.ClientSession, n: int, record: bool = True) -> Result:
        url = f"{self.dep.url}/v1/completions"
        stream = n % 2 == 1
        t_send = time.monotonic()
        res = Result(t=t_send - self.t0, status=0, latency_s=0.0)
        self.outstanding += 1
        try:
            async with session.post(url, json=self.body(n, stream)) as resp:
                data = await resp.read()
                res.status = resp.status
                if resp.status == 200 and stream:
                    # a stream that broke after its headers ends with an error event, then [DONE]
                    if b'"error"' in data or not data.rstrip().endswith(b"data: [DONE]"):
                        res.status, res.error = 0, "stream ended with an error event"
                elif resp.status != 200:
                    res.error = data[:120].decode(errors="replace")
        except (TimeoutError, aiohttp.ClientError, OSError) as err:
            res.error = type(err).__name__
        finally:
            self.outstanding -= 1
        res.latency_s = time.monotonic() - t_send
        if record:
            self.results.append(res)
        return res

    def session(self) -> aiohttp.ClientSession:
        # A fresh connection per request: the kernel spreads connections over the replicas' sockets.
        connector = aiohttp.TCPConnector(limit=0, force_close=True)
        timeout = aiohttp.ClientTimeout(total=self.cfg.request_timeout_s)
        return aiohttp.ClientSession(connector=connector, timeout=timeout)

    async def measure_capacity(self, session: aiohttp.ClientSession) -> float:
        """Completed requests a second of a closed loop at twice the pods' batch slots."""
        concurrency = 2 * self.cfg.pods * self.cfg.max_num_seqs
        deadline = time.monotonic() + self.cfg.capacity_s
        done = 0
        counter = iter(range(10**9, 2 * 10**9))  # ids apart from the soak's own prompts

        async def client() -> None:
            nonlocal done
            while time.monotonic() < deadline:
                if (await self.one(session, next(counter), record=False)).status == 200:
                    done += 1

        t = time.monotonic()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        return done / (time.monotonic() - t)

    async def open_loop(self, session: aiohttp.ClientSession, rate: float, seconds: float) -> None:
        rng = random.Random(self.cfg.seed)
        tasks: set[asyncio.Task] = set()
        n = 0
        next_t = time.monotonic()
        end = self.t0 + seconds
        while next_t < end:
            await asyncio.sleep(max(0.0, next_t - time.monotonic()))
            if self.outstanding >= self.cfg.max_outstanding:
                self.skipped += 1
            else:
                task = asyncio.create_task(self.one(session, n))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            n += 1
            next_t += rng.expovariate(rate)
        if tasks:
            await asyncio.wait(tasks, timeout=self.cfg.request_timeout_s + 5)

    # --- the run -------------------------------------------------------------------------------

    async def run(self) -> dict[str, Any]:
        cfg = self.cfg
        seconds = cfg.minutes * 60
        model_capacity = engine_capacity(cfg)
        async with self.session() as session:
            for n in range(8):  # warm up (not counted)
                await self.one(session, -1 - n, record=False)
            measured = await self.measure_capacity(session) if cfg.capacity_s > 0 else None
            capacity = min(measured, model_capacity) if measured else model_capacity
            rate = cfg.load * capacity
            print(f"capacity: engine model {model_capacity:.1f} req/s, measured {measured} req/s; "
                  f"soak at {rate:.1f} req/s for {seconds:.0f} s", flush=True)  # fmt: skip
            await asyncio.sleep(2)  # the capacity run's requests drain
            self.t0 = time.monotonic()
            await asyncio.gather(self.open_loop(session, rate, seconds), self.fault_loop(seconds),
                                 self.sample_loop(seconds))  # fmt: skip
        self.samples.append(await asyncio.to_thread(self.sample))
        return self.report(model_capacity, measured, rate, seconds)


def shared_prompt(i: int, chars: int) -> str:
    """Shared system prompt i, `chars` long."""
    rng = random.Random(f"shared-prefix:{i}")
    words = [f"system prompt {i}:"]
    while sum(len(w) + 1 for w in words) < chars:
        words.append(rng.choice(WORDS))
    return " ".join(words)


def engine_capacity(cfg: SoakConfig) -> float:
    """Requests a second the pods can finish by the simulator's engine model (TimingConfig):
    a full batch of max_num_seqs decoding max_tokens steps, plus each prompt's prefill."""
    from ray_epp.simulator import CHARS_PER_TOKEN, TimingConfig

    t = TimingConfig()
    prompt_tokens = cfg.prompt_chars / CHARS_PER_TOKEN
    ctx = prompt_tokens + cfg.max_tokens / 2
    step = t.step_overhead_s + cfg.max_num_seqs * (t.decode_per_seq_s + ctx * t.kv_read_per_token_s)
    per_request = cfg.max_tokens * step + prompt_tokens * t.prefill_per_token_s
    return cfg.pods * cfg.max_num_seqs / per_request


def run_soak(cfg: SoakConfig, out: Path | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="epp-soak-") as td:
        soak = Soak(cfg, Path(td))
        try:
            soak.start()
            report = asyncio.run(soak.run())
        finally:
            soak.stop()
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
        plot(report, out.with_suffix(".png"))
        plot_small(report, out.with_name(out.name + "_rss.png"), out.with_name(out.name + "_errors.png"))
        plot_profile_actors(report, out.with_name(out.name + "_profile_actors.png"))
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.soak", description=__doc__.split("\n")[0])
    d = SoakConfig()
    p.add_argument("--minutes", type=float, default=d.minutes)
    p.add_argument("--load", type=float, default=d.load)
    p.add_argument("--pods", type=int, default=d.pods)
    p.add_argument("--replicas", type=int, default=d.replicas)
    p.add_argument("--port", type=int, default=int(os.environ.get("EPP_TEST_PORT", d.port)))
    p.add_argument("--fault-every", type=float, default=d.fault_every_s)
    p.add_argument("--pod-down", type=float, default=d.pod_down_s)
    p.add_argument("--sample-every", type=float, default=d.sample_every_s)
    p.add_argument("--capacity-seconds", type=float, default=d.capacity_s, help="0: use the engine model's")
    p.add_argument(
        "--faults", nargs="*", default=None, choices=FAULTS, help="default: all (kv-publisher with --kv-events)"
    )
    p.add_argument("--nodes", type=int, default=d.nodes, help="worker nodes of a local cluster (0: one local Ray)")
    p.add_argument("--kv-events", action="store_true", help="pods publish KV events; the precise prefix index follows")
    p.add_argument("--shared-prefix", type=float, default=d.shared_prefix)
    p.add_argument("--hang", type=float, default=d.hang_s, help="seconds a hung pod stays SIGSTOPped")
    p.add_argument(
        "--tracemalloc", action="store_true", help="report the allocation sites growing in the default profile's actor"
    )
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "soak")
    p.add_argument(
        "--summarize", type=Path, help="an earlier report (JSON): print its memory table, draw its figures to --out"
    )
    a = p.parse_args(argv)
    if a.summarize:
        report = json.loads(a.summarize.read_text())
        print_summary(report)
        plot(report, a.out.with_suffix(".png"))
        plot_small(report, a.out.with_name(a.out.name + "_rss.png"), a.out.with_name(a.out.name + "_errors.png"))
        plot_profile_actors(report, a.out.with_name(a.out.name + "_profile_actors.png"))
        return 0
    optional = {"kv-publisher": a.kv_events, "node": a.nodes > 0}
    faults = a.faults if a.faults is not None else [f for f in FAULTS if optional.get(f, True)]
    cfg = SoakConfig(
        minutes=a.minutes, load=a.load, pods=a.pods, replicas=a.replicas, port=a.port, fault_every_s=a.fault_every,
        pod_down_s=a.pod_down, sample_every_s=a.sample_every, capacity_s=a.capacity_seconds, faults=tuple(faults),
        kv_events=a.kv_events, shared_prefix=a.shared_prefix, hang_s=a.hang, nodes=a.nodes,
        tracemalloc=a.tracemalloc,
    )  # fmt: skip
    report = run_soak(cfg, a.out)
    keys = ("capacity", "rate_rps", "sent", "ok", "failed", "failed_by", "held_by_lost_replica", "fault_free")
    summary = {k: report[k] for k in keys}
    print(json.dumps(summary, indent=1))
    for f in report["faults"]:
        print(f"  {f['kind']:16} at {f['t']:7.1f} s: {f['requests']} ended, {f['failed']} failed {f['failed_by']} "
              f"({f['held_by_lost_replica']} held by a lost replica), "
              f"back after {f['recovered_s']} s")  # fmt: skip
    for row in report.get("tracemalloc", []):
        print(f"  tracemalloc at {row['t']:7.1f} s: {row}")
    for k, v in report["sizes"].items():
        print(f"  {k}: {v}")
    print(f"wrote {a.out}.json, .png, _rss.png and _errors.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
