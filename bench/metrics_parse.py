"""CPU cost of reading a model server's /metrics, on a real vLLM page (tests/fixtures/metrics).

    .venv/bin/python -m bench.metrics_parse            # parse only: ours vs prometheus_client
    .venv/bin/python -m bench.metrics_parse --loop     # + the scrape loop without Ray, aiohttp vs keep-alive
    .venv/bin/python -m bench.metrics_parse --scrape   # + a real NodeMetricsActor scraping over HTTP

Parse: CPU time (time.process_time) per parse of the whole page into `Metrics`, for
`scheduler.engine_metrics.parse_metrics` and for prometheus_client's text parser followed by the
same extraction, in the same run. Scrape: a local HTTP server (its own process) serves the page,
one NodeMetricsActor scrapes it every 50 ms and reports to a DatastoreActor; the CPU of the metrics
actor's and the datastore's processes (psutil) is divided by the scrapes. Two pages: an idle one
(the metrics never change: reports are heartbeats, 1 a second) and a busy one (the queue length
changes on every scrape: every scrape is reported)."""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import socket
import statistics
import sys
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from scheduler.engine_metrics import SGLANG, VLLM, parse_metrics
from scheduler.types import Metrics

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "metrics"
VLLM_PAGE = FIXTURES / "vllm_v1_qwen1.5_0.5b.prom"
SGLANG_PAGE = FIXTURES / "sglang_llama3.1_8b.prom"
VLLM_NAMES = ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc")
SGLANG_NAMES = ("sglang:num_queue_reqs", "sglang:num_running_reqs", "sglang:token_usage")


def prometheus_client_parse(text: str, names: tuple[str, str, str]) -> Metrics:
    """The reference: prometheus_client's full parser, then pick the three values."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in names and sample.name not in found:
                found[sample.name] = sample.value
    return Metrics(
        waiting_queue_size=int(found[names[0]]),
        running_requests_size=int(found[names[1]]),
        kv_cache_usage_percent=found[names[2]],
    )


def cpu_per_call_us(fn, repeat: int, rounds: int = 5) -> float:
    """Median over `rounds` of the CPU time per call, in microseconds."""
    per_call = []
    for _ in range(rounds):
        start = time.process_time()
        for _ in range(repeat):
            fn()
        per_call.append((time.process_time() - start) / repeat * 1e6)
    return statistics.median(per_call)


def bench_parse() -> dict:
    results = {}
    for label, path, spec, names in (
        (
            "vllm",
            VLLM_PAGE,
            VLLM,
            ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"),
        ),
        ("sglang", SGLANG_PAGE, SGLANG, ("sglang:num_queue_reqs", "sglang:num_running_reqs", "sglang:token_usage")),
    ):
        text = path.read_text()
        ours = parse_metrics(text, spec)
        ref = prometheus_client_parse(text, names)
        assert ours.ok and (ours.metrics.waiting_queue_size, ours.metrics.kv_cache_usage_percent) == (
            ref.waiting_queue_size,
            ref.kv_cache_usage_percent,
        )
        results[label] = {
            "page_bytes": len(text.encode()),
            "page_lines": text.count("\n"),
            "ours_us": round(cpu_per_call_us(lambda t=text, s=spec: parse_metrics(t, s), 2000), 1),
            "prometheus_client_us": round(
                cpu_per_call_us(lambda t=text, n=names: prometheus_client_parse(t, n), 40), 1
            ),
        }
        r = results[label]
        r["speedup"] = round(r["prometheus_client_us"] / r["ours_us"], 1)
    return results


# --- scrape: a real actor over HTTP ----------------------------------------------------------------


def _serve(port: int, page: str, busy: bool) -> None:
    from aiohttp import web

    counter = {"n": 0}
    marker = 'vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen1.5-0.5B-Chat"} 0.0'
    assert marker in page

    async def metrics(request: web.Request) -> web.Response:
        body = page
        if busy:
            counter["n"] += 1
            body = page.replace(marker, marker[:-3] + f"{counter['n'] % 50}.0")
        return web.Response(text=body, content_type="text/plain")

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "Qwen/Qwen1.5-0.5B-Chat"}]})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/models", models)
    web.run_app(app, host="127.0.0.1", port=port, print=None, handle_signals=False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray_process(title: str):
    import psutil

    for p in psutil.process_iter(["name", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if title in (p.info["name"] or "") or title in cmd:
            return p
    raise RuntimeError(f"no process {title!r}")


def bench_scrape(seconds: float) -> dict:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    from actors import ActorOptions, PodSpec
    from actors.datastore import DatastoreActor

    page = VLLM_PAGE.read_text()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, namespace="bench-metrics")
    results = {}
    try:
        for label, busy in (("idle page", False), ("busy page", True)):
            port = _free_port()
            # spawn: a forked child would inherit Ray's signal handlers
            server = multiprocessing.get_context("spawn").Process(target=_serve, args=(port, page, busy), daemon=True)
            server.start()
            name = f"bench-ds-{'busy' if busy else 'idle'}"
            options = ActorOptions(datastore_name=name)
            ds = DatastoreActor.options(name=name, max_restarts=0).remote(
                [PodSpec(name="pod", address="127.0.0.1", port=port).model_dump()], options.model_dump(), name
            )
            ray.get(ds.ping.remote())
            actor = ray.get(ds.metrics_actors.remote())["pod"]
            deadline = time.monotonic() + 30
            while ray.get(actor.stats.remote())["reports"] < 1 and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(1.0)  # warm up
            actor_proc, ds_proc = _ray_process("ray::NodeMetricsActor"), _ray_process("ray::DatastoreActor")

            def cpu(p):
                t = p.cpu_times()
                return t.user + t.system

            s0, a0, d0 = ray.get(actor.stats.remote()), cpu(actor_proc), cpu(ds_proc)
            time.sleep(seconds)
            s1, a1, d1 = ray.get(actor.stats.remote()), cpu(actor_proc), cpu(ds_proc)
            # the same processes with the scraper stopped: what a Ray actor process costs doing nothing
            ray.get(actor.stop.remote())
            time.sleep(1.0)
            b0, e0 = cpu(actor_proc), cpu(ds_proc)
            time.sleep(seconds / 2)
            idle_actor, idle_ds = (cpu(actor_proc) - b0) / (seconds / 2), (cpu(ds_proc) - e0) / (seconds / 2)
            scrapes, reports = s1["scrapes"] - s0["scrapes"], s1["reports"] - s0["reports"]
            results[label] = {
                "scrapes": scrapes,
                "reports": reports,
                "failures": s1["failures"] - s0["failures"],
                "scrapes_per_s": round(scrapes / seconds, 1),
                "parse_us_avg": s1["parse_us_avg"],
                "actor_cpu_us_per_scrape": round((a1 - a0) / scrapes * 1e6),
                "datastore_cpu_us_per_scrape": round((d1 - d0) / scrapes * 1e6),
                "actor_cpu_percent_of_core": round((a1 - a0) / seconds * 100, 2),
                "idle_actor_cpu_percent_of_core": round(idle_actor * 100, 2),
                "idle_datastore_cpu_percent_of_core": round(idle_ds * 100, 2),
                "actor_cpu_us_per_scrape_above_idle": round(((a1 - a0) - idle_actor * seconds) / scrapes * 1e6),
                "datastore_cpu_us_per_scrape_above_idle": round(((d1 - d0) - idle_ds * seconds) / scrapes * 1e6),
            }
            ray.get(ds.shutdown.remote())
            ray.kill(ds, no_restart=True)
            server.terminate()
            server.join(5)
            time.sleep(0.5)
    finally:
        ray.shutdown()
    return results


def bench_loop(seconds: float) -> dict:
    """The scrape loop (`PodScraper`) in this process, no Ray, with each HTTP client."""
    import asyncio

    from actors.options import ActorOptions, PodSpec
    from actors.scraper import PodScraper

    port = _free_port()
    server = multiprocessing.get_context("spawn").Process(
        target=_serve, args=(port, VLLM_PAGE.read_text(), False), daemon=True
    )
    server.start()

    async def run(client: str) -> dict:
        async def report(*args) -> None:
            return None

        options = ActorOptions(http_client=client)
        scraper = PodScraper(PodSpec(name="pod", address="127.0.0.1", port=port), options, report)
        deadline = time.monotonic() + 30
        while scraper.last_success is None and time.monotonic() < deadline:
            if not scraper.running:
                scraper.start()
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.0)
        cpu0, n0 = time.process_time(), scraper.counters.scrapes
        await asyncio.sleep(seconds)
        cpu, n = time.process_time() - cpu0, scraper.counters.scrapes - n0
        await scraper.stop()
        parse_us = scraper.stats()["parse_us_avg"]
        return {"scrapes": n, "cpu_us_per_scrape": round(cpu / n * 1e6), "parse_us_avg": parse_us}

    try:
        return {client: asyncio.run(run(client)) for client in ("aiohttp", "fast")}
    finally:
        server.terminate()
        server.join(5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loop", action="store_true", help="also measure the scrape loop without Ray, per client")
    parser.add_argument("--scrape", action="store_true", help="also measure a NodeMetricsActor over HTTP (Ray)")
    parser.add_argument("--seconds", type=float, default=10.0, help="measuring time per scrape scenario")
    parser.add_argument("--json", action="store_true", help="print JSON only")
    args = parser.parse_args(argv)
    out = {"parse": bench_parse()}
    if args.loop:
        out["loop"] = bench_loop(args.seconds)
    if args.scrape:
        out["scrape"] = bench_scrape(args.seconds)
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    for label, r in out["parse"].items():
        print(
            f"parse {label:6s} page {r['page_bytes']:6d} B {r['page_lines']:4d} lines: ours {r['ours_us']:8.1f} us  "
            f"prometheus_client {r['prometheus_client_us']:9.1f} us  ({r['speedup']}x)"
        )
    for client, r in out.get("loop", {}).items():
        print(
            f"loop (no Ray) {client:7s}: {r['cpu_us_per_scrape']} us CPU/scrape over {r['scrapes']} scrapes, "
            f"parse {r['parse_us_avg']} us"
        )
    for label, r in out.get("scrape", {}).items():
        print(
            f"scrape {label}: {r['scrapes_per_s']}/s, {r['reports']} reports / {r['scrapes']} scrapes, "
            f"metrics actor {r['actor_cpu_us_per_scrape']} us CPU/scrape "
            f"({r['actor_cpu_percent_of_core']}% of a core), "
            f"datastore {r['datastore_cpu_us_per_scrape']} us CPU/scrape, parse {r['parse_us_avg']} us; "
            f"above an idle actor process ({r['idle_actor_cpu_percent_of_core']}% / "
            f"{r['idle_datastore_cpu_percent_of_core']}% of a core): metrics actor "
            f"{r['actor_cpu_us_per_scrape_above_idle']} us, datastore {r['datastore_cpu_us_per_scrape_above_idle']} us"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
