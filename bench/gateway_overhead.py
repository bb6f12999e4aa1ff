"""What a router adds on top of calling the model server directly, side by side in one run.

Targets, each in front of the same fake workers (bench/fake_worker.py, answering at once):
direct, the best minimal Ray Serve forwarder (bench/serve_forwarder.py), our gateway (`epp up`:
a decision through the profile actors per request; `epp-2-replicas`: two gateway replicas on the
port; `epp-flow-control`: the same with the
`flowControl` gate on, so every request passes the gateway's queue; `-window-1` with one dispatched
request at a time; `epp-decision-record`: every decision recorded for `epp explain`;
`epp-tracing-1pct` / `-100pct`: OpenTelemetry traces of that share of the requests), SMG (the
SGLang Model Gateway, `cache_aware`), `dynamo-forwarder` (Dynamo's selection core behind
bench/dynamo_forwarder.py, the end-to-end `dynamo-kv` target; ai-dynamo-runtime installed),
sglang-router and vllm-router (optional extras,
`pip install -e .[peers]`; skipped with a note when absent).

Per target: sequential p50/p99 (and added over direct), closed-loop req/s at concurrency 32,
streaming time to first byte (20 events, 10 ms apart), decision time (our gateway's
scheduler e2e histogram). Writes bench/results/gateway_overhead.json and prints a Markdown table.

    .venv/bin/python -m bench.gateway_overhead [--seq 500] [--seconds 8] [--targets direct serve epp ...]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

from bench.loadgen import closed_loop, sequential, stream_ttfb

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
WORKER_PORTS = [9101, 9102, 9103, 9104]
BODY = json.dumps({"model": "fake-model", "prompt": "x" * 1900, "max_tokens": 16}).encode()  # ~2 KB
IDLE_S = 3.0  # the idle window that tells a target's fixed CPU (background loops) from its per-request CPU
STREAM_BODY = json.dumps({"model": "fake-model", "prompt": "hello", "max_tokens": 20, "stream": True}).encode()


def _bin(name: str) -> str | None:
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else shutil.which(name)


READY_TIMEOUT_S = [300.0]  # --ready-timeout: a loaded machine starts Ray slowly


def _wait_http(url: str, timeout_s: float | None = None, proc: subprocess.Popen | None = None) -> None:
    """Until `url` answers 200; TimeoutError after `timeout_s`, or as soon as `proc` has exited."""
    timeout_s = READY_TIMEOUT_S[0] if timeout_s is None else timeout_s
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise TimeoutError(f"{url} not ready: the process exited with {proc.returncode}")
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as r:
            if r.status == 200:
                return
        time.sleep(0.3)
    raise TimeoutError(f"{url} not ready after {timeout_s} s")


@contextlib.contextmanager
def _process(cmd: list[str], ready_url: str | None, log: Path):
    """Run `cmd` in its own session until the block ends; first wait for `ready_url` to answer 200 (unless None)."""
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
        try:
            if ready_url is not None:
                _wait_http(ready_url, proc=proc)
            yield proc
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def targets(workers: list[str], tmp: Path, offset: int = 0) -> dict[str, tuple[list[str], str, str]]:
    """name -> (command, readiness URL, base URL); every port shifted by `offset`."""
    py = sys.executable
    pods = tmp / "pods.json"
    pods.write_text(
        json.dumps([{"name": f"w{i}", "address": "127.0.0.1", "port": p + offset} for i, p in enumerate(WORKER_PORTS)])
    )
    fwd, epp, sgl, vll, flow, flow1, smg = (str(p + offset) for p in (8300, 8400, 8500, 8600, 8700, 8800, 8900))
    ha_rr, ha_pick, ha_epp, slow, epp2, local = (str(p + offset) for p in (9000, 9010, 9020, 9030, 9040, 9050))
    # The default config with the flowControl gate on: every request passes the gateway's queue.
    flow_cfg = tmp / "default-flow-control.yaml"
    cfg = yaml.safe_load((ROOT / "ray_epp" / "configs" / "default.yaml").read_text())
    cfg["featureGates"] = ["flowControl"]
    flow_cfg.write_text(yaml.safe_dump(cfg, sort_keys=False))
    # The same with a dispatch window of one request (a dispatched request scheduled before the next leaves).
    window1 = tmp / "window-1.yaml"
    window1.write_text(yaml.safe_dump({"flow_dispatch_window": 1}))
    # The gateway with its hot routes through FastAPI's stack (serve_app/gateway/hot_routes.py off).
    no_hot = tmp / "no-hot-routes.yaml"
    no_hot.write_text(yaml.safe_dump({"hot_routes": False}))
    # The profiles run in the replica (serve_app/gateway/local_runner.py): no profile-actor hop.
    in_replica = tmp / "decide-in-replica.yaml"
    in_replica.write_text(yaml.safe_dump({"decide_in_replica": True}))

    # The default gateway with one observability setting on: every decision recorded (epp explain),
    # or OpenTelemetry traces at 1 % / 100 % (made and propagated; no collector to export to).
    observed = {
        "epp-decision-record": {"decision_record_ratio": 1.0, "admin_token": "bench-admin-token-0123"},
        "epp-tracing-1pct": {"tracing_sample_ratio": 0.01, "tracing_exporter": "none"},
        "epp-tracing-100pct": {"tracing_sample_ratio": 1.0, "tracing_exporter": "none"},
    }
    epp_up = [py, "-m", "serve_app.cli", "up", "--pods", str(pods), "--port"]
    out = {
        "serve-forwarder": (
            [py, "-m", "bench.serve_forwarder", "--port", fwd, "--workers", *workers],
            f"http://127.0.0.1:{fwd}/health",
            f"http://127.0.0.1:{fwd}",
        ),
        "epp": (
            [py, "-m", "serve_app.cli", "up", "--pods", str(pods), "--port", epp],
            f"http://127.0.0.1:{epp}/ready",
            f"http://127.0.0.1:{epp}",
        ),
        "epp-fastapi": (
            [*epp_up, slow, "--settings", str(no_hot)],
            f"http://127.0.0.1:{slow}/ready",
            f"http://127.0.0.1:{slow}",
        ),
        "epp-in-replica": (
            [*epp_up, local, "--settings", str(in_replica)],
            f"http://127.0.0.1:{local}/ready",
            f"http://127.0.0.1:{local}",
        ),
        # Two gateway replicas on one port (the kernel spreads connections): the cost of surviving
        # a replica's death, measured against "epp" (one) in the same run.
        "epp-2-replicas": (
            [*epp_up, epp2, "--replicas", "2"],
            f"http://127.0.0.1:{epp2}/ready",
            f"http://127.0.0.1:{epp2}",
        ),
        "epp-flow-control": (
            [py, "-m", "serve_app.cli", "up", "--pods", str(pods), "--port", flow, "--config", str(flow_cfg)],
            f"http://127.0.0.1:{flow}/ready",
            f"http://127.0.0.1:{flow}",
        ),
        "epp-flow-control-window-1": (
            [*epp_up, flow1, "--config", str(flow_cfg), "--settings", str(window1)],
            f"http://127.0.0.1:{flow1}/ready",
            f"http://127.0.0.1:{flow1}",
        ),
    }
    if shutil.which("haproxy"):  # a compiled byte mover (bench/haproxy_front.py)
        front = [py, "-m", "bench.haproxy_front", "--pods", str(pods)]
        out["haproxy-rr"] = (
            [*front, "--mode", "rr", "--port", ha_rr],
            f"http://127.0.0.1:{ha_rr}/health",
            f"http://127.0.0.1:{ha_rr}",
        )
        out["haproxy-epp-pick"] = (
            [*front, "--mode", "pick", "--httpclient", "--port", ha_pick, "--epp-port", ha_epp],
            f"http://127.0.0.1:{ha_pick}/ready",
            f"http://127.0.0.1:{ha_pick}",
        )
    if sg := _bin("sglang-router"):
        out["sglang-router"] = (
            [
                sg,
                "launch",
                "--worker-urls",
                *workers,
                "--policy",
                "cache_aware",
                "--host",
                "127.0.0.1",
                "--port",
                sgl,
            ],
            f"http://127.0.0.1:{sgl}/health",
            f"http://127.0.0.1:{sgl}",
        )
    if sm := _bin("smg"):  # SGLang Model Gateway, the successor of sglang-router
        out["smg"] = (
            [sm, "launch", "--worker-urls", *workers, "--policy", "cache_aware", "--host", "127.0.0.1", "--port", smg],
            f"http://127.0.0.1:{smg}/health",
            f"http://127.0.0.1:{smg}",
        )
    if importlib.util.find_spec("dynamo") is not None:  # Dynamo's selection core behind bench/dynamo_forwarder.py
        kv_pods = tmp / "pods-kv-events.json"  # nothing publishes there: Dynamo decides on an empty index
        listed = json.loads(pods.read_text())
        for i, pod in enumerate(listed):
            pod["kvEvents"] = {"endpoint": f"tcp://127.0.0.1:{9110 + i + offset}"}
        kv_pods.write_text(json.dumps(listed))
        dyn = str(9060 + offset)
        out["dynamo-forwarder"] = (
            [py, "-m", "bench.dynamo_forwarder", "--port", dyn, "--pods", str(kv_pods)],
            f"http://127.0.0.1:{dyn}/health",
            f"http://127.0.0.1:{dyn}",
        )
    if vr := _bin("vllm-router"):
        out["vllm-router"] = (
            [vr, "--worker-urls", *workers, "--policy", "cache_aware", "--host", "127.0.0.1", "--port", vll],
            f"http://127.0.0.1:{vll}/health",
            f"http://127.0.0.1:{vll}",
        )
    for (name, settings), port in zip(observed.items(), (9200, 9300, 9400), strict=True):
        path = tmp / f"{name}.yaml"
        path.write_text(yaml.safe_dump(settings))
        base = f"http://127.0.0.1:{port + offset}"
        out[name] = ([*epp_up, str(port + offset), "--settings", str(path)], f"{base}/ready", base)
    return out


async def measure(base: str, n_seq: int, seconds: float, pid: int | None = None) -> dict:
    """`pid`: the target's process; its whole tree's CPU time over the closed loop is counted."""
    url = f"{base}/v1/completions"
    await wait_serving(url)
    before = scheduler_buckets(base)
    seq = await sequential(url, BODY, n_seq)
    decision = decision_p50_ms(before, scheduler_buckets(base))
    idle = await idle_cpu_s(pid, IDLE_S)  # what the target spends per second with no request
    cpu_before = tree_cpu_s(pid)
    rps, errors = await closed_loop(url, BODY, 32, seconds)
    cpu = tree_cpu_s(pid)
    by_title: dict[str, float] = {}
    for key, t in cpu.items():
        by_title[key[1]] = by_title.get(key[1], 0.0) + t - cpu_before.get(key, 0.0)
    by_process = sorted(((t, title) for title, t in by_title.items()), reverse=True)
    done = rps * seconds
    cpu_ms = None if pid is None or not done else sum(by_title.values()) * 1000 / done
    # The CPU the requests added, by process: the loop's minus what the same process spends idle.
    marginal = {title: 1000 * (t - idle.get(title, 0.0) * seconds / IDLE_S) / done for t, title in by_process if done}
    first, total = await stream_ttfb(url, STREAM_BODY, 30)
    return {
        "decision_p50_ms_le": decision,
        "seq_p50_ms": seq.p50,
        "seq_p99_ms": seq.pct(0.99),
        "rps_c32": rps,
        "errors_c32": errors,
        # CPU of every process of the target per request of the closed loop (all of it, and what
        # the requests added to the idle target): what the router costs, whatever share of the
        # cores the machine's load left it.
        "cpu_ms_per_req_c32": cpu_ms,
        "cpu_ms_per_req_added_c32": None if cpu_ms is None else sum(marginal.values()),
        "cpu_ms_per_req_added_by_process": dict(sorted(marginal.items(), key=lambda kv: -kv[1])[:8]),
        "ttfb_p50_ms": first.p50,
        "stream_total_p50_ms": total.p50,
        "load_average_1m": os.getloadavg()[0],
    }


async def wait_serving(url: str, timeout_s: float = 120) -> None:
    """Until a completion is answered 200: a router may be up before it knows its workers (SMG
    answers 404 until its worker discovery has run, which takes longer on a loaded machine)."""
    import aiohttp

    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as s:
        while True:
            with contextlib.suppress(aiohttp.ClientError):
                async with s.post(url, data=BODY, headers={"content-type": "application/json"}) as r:
                    await r.read()
                    if r.status == 200:
                        return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} answered no completion within {timeout_s} s")
            await asyncio.sleep(0.5)


async def idle_cpu_s(pid: int | None, seconds: float) -> dict[str, float]:
    """CPU seconds each process of the target's tree (by title) spends in `seconds` of no requests."""
    before = tree_cpu_s(pid)
    await asyncio.sleep(seconds if pid is not None else 0)
    out: dict[str, float] = {}
    for key, t in tree_cpu_s(pid).items():
        out[key[1]] = out.get(key[1], 0.0) + t - before.get(key, 0.0)
    return out


def tree_cpu_s(pid: int | None) -> dict[tuple[int, str], float]:
    """CPU seconds (user + system) of a process and all its descendants, by (pid, process title)."""
    import psutil

    if pid is None:
        return {}
    out: dict[tuple[int, str], float] = {}
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        for proc in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                t = proc.cpu_times()
                title = " ".join(proc.cmdline())[:60].strip()
                out[(proc.pid, title)] = t.user + t.system + t.children_user + t.children_system
    return out


def scheduler_buckets(base: str) -> list[tuple[float, float]]:
    """Our scheduler's e2e histogram from /metrics: (upper bound, cumulative count)."""
    buckets = []
    with contextlib.suppress(OSError):
        text = urllib.request.urlopen(f"{base}/metrics", timeout=5).read().decode()
        for line in text.splitlines():
            if line.startswith("inference_extension_scheduler_e2e_duration_seconds_bucket"):
                le = line.split('le="')[1].split('"')[0]
                buckets.append((float("inf") if le == "+Inf" else float(le), float(line.rsplit(" ", 1)[1])))
    return buckets


def decision_p50_ms(before: list[tuple[float, float]], after: list[tuple[float, float]]) -> float | None:
    """The p50 decision time between two histogram reads, as the bucket bound that holds it."""
    if not after:
        return None
    counts = [(le, c - (before[i][1] if i < len(before) else 0.0)) for i, (le, c) in enumerate(after)]
    total = counts[-1][1]
    return None if total <= 0 else next(le for le, c in counts if c >= total / 2) * 1000


def _ms(ms: float | None) -> str:
    return "-" if ms is None else f"{ms:.2f} ms"


def _le(ms: float | None) -> str:
    return "-" if ms is None else f"≤ {ms:g} ms"


def failed(err: Exception, log: Path) -> dict:
    return {"error": f"{type(err).__name__}: {err}", "log_tail": log.read_text()[-2000:] if log.exists() else ""}


def measure_all_up(chosen: dict, tmp: Path, a: argparse.Namespace, direct: str | None) -> dict[str, dict]:
    """Every target up at once (one start each, the slow part on a loaded machine), then measured
    in turn, round after round, so each round compares the targets under the same load."""
    rows: dict[str, dict] = {}
    with contextlib.ExitStack() as stack:
        up: dict[str, tuple[str, int | None]] = {} if direct is None else {"direct": (direct, None)}
        for name, (cmd, ready, base) in chosen.items():
            try:
                proc = stack.enter_context(_process(cmd, ready, tmp / f"{name}.log"))
                up[name] = (base, proc.pid)
            except Exception as err:
                rows[name] = failed(err, tmp / f"{name}.log")
                print(name, rows[name], flush=True)
        for i in range(a.rounds):
            for name, (base, pid) in up.items():
                try:
                    rows[f"{name}#{i + 1}"] = asyncio.run(measure(base, a.seq, a.seconds, pid))
                except Exception as err:
                    rows[f"{name}#{i + 1}"] = failed(err, tmp / f"{name}.log")
                print(f"{name}#{i + 1}", rows[f"{name}#{i + 1}"], flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seq", type=int, default=500)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--targets", nargs="*", default=None)
    p.add_argument("--port-offset", type=int, default=0, help="shift every port (workers 9101.., targets 8300..)")
    p.add_argument(
        "--rounds",
        type=int,
        default=0,
        help="start every target first, then measure them in turn this many times (rows: name#round); "
        "0: one target up at a time",
    )
    p.add_argument("--ready-timeout", type=float, default=300.0, help="seconds a target may take to start")
    a = p.parse_args()
    READY_TIMEOUT_S[0] = a.ready_timeout
    RESULTS.mkdir(parents=True, exist_ok=True)
    worker_ports = [port + a.port_offset for port in WORKER_PORTS]
    workers = [f"http://127.0.0.1:{port}" for port in worker_ports]
    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        worker_cmd = [sys.executable, "-m", "bench.fake_worker", "--ports", *map(str, worker_ports)]
        with _process(worker_cmd, f"{workers[0]}/health", tmp / "workers.log"):
            with_direct = a.targets is None or "direct" in a.targets
            if with_direct and not a.rounds:
                rows["direct"] = asyncio.run(measure(workers[0], a.seq, a.seconds))  # workers' CPU: not a router
                print("direct", rows["direct"], flush=True)
            chosen = {
                n: t
                for n, t in targets(workers, tmp, a.port_offset).items()
                if a.targets in (None, []) or n in a.targets
            }
            if a.rounds:
                rows.update(measure_all_up(chosen, tmp, a, workers[0] if with_direct else None))
            for name, (cmd, ready, base) in chosen.items() if not a.rounds else ():
                try:
                    with _process(cmd, ready, tmp / f"{name}.log") as proc:
                        rows[name] = asyncio.run(measure(base, a.seq, a.seconds, proc.pid))
                except Exception as err:  # a peer that fails to start is reported, not fatal
                    rows[name] = failed(err, tmp / f"{name}.log")
                print(name, rows[name], flush=True)
    for name, row in rows.items():  # over the same round's direct row
        direct = rows.get("direct" + (name[name.index("#") :] if "#" in name else ""), {}).get("seq_p50_ms")
        if direct and "seq_p50_ms" in row:
            row["added_p50_ms"] = row["seq_p50_ms"] - direct
    out = {
        "machine": f"{os.cpu_count()} cores",
        "when": time.strftime("%Y-%m-%d %H:%M"),
        "load_average": os.getloadavg(),
        "rows": rows,
    }
    (RESULTS / "gateway_overhead.json").write_text(json.dumps(out, indent=2))
    print("\n| target | seq p50 | added p50 | seq p99 | req/s @32 | CPU added/req @32 | stream TTFB p50 ", end="")
    print("| decision p50 (bucket) |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        if "error" in r:
            print(f"| {name} | failed: {r['error']} | | | | | | |")
            continue
        print(
            f"| {name} | {r['seq_p50_ms']:.2f} ms | {r.get('added_p50_ms', 0):+.2f} ms | {r['seq_p99_ms']:.2f} ms "
            f"| {r['rps_c32']:.0f} | {_ms(r.get('cpu_ms_per_req_added_c32'))} | {r['ttfb_p50_ms']:.1f} ms "
            f"| {_le(r.get('decision_p50_ms_le'))} |"
        )


if __name__ == "__main__":
    main()
