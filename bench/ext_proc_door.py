"""The ext_proc door against the HTTP door, in the same run on the same deployment: decisions per
second of one gateway replica and the latency a decision adds per request.

* ext_proc: what Envoy sends for a request (headers, the body with end_of_stream) until the headers
  response (the pick) and the echoed body come back, then the response phase with a small body, so
  each request is told complete as Envoy would (no model server is reached: the decision alone);
* HTTP: `POST /v1/pick` (the HTTP door's decision without forwarding: intake, parse, admit,
  schedule, PreRequest and ResponseComplete).

Both doors run GatewayCore's one request path on the same profile actors (the `default` config,
simulated pods for the snapshot). Sequential requests, interleaved over the doors, give the added
latency (p50 / p99); N concurrent clients give the decisions per second (each door twice, in
opposite orders, averaged: the machine's drift falls on both).

With `--envoy` (a real Envoy: the `envoy` extra, bench/real_envoy.py, deploy/envoy.yaml), whole
requests too, each to a simulated pod and back (`max_tokens` 1): straight to the pod, through the
HTTP gateway (it forwards), and through Envoy asking Ray EPP over ext_proc (Envoy forwards). The
difference to the pod's own figure is what each door adds to a request.

    python -m bench.ext_proc_door [--requests 2000] [--concurrency 32] [--port 8460] [--envoy]"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

import aiohttp
import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
RESPONSE = json.dumps({"choices": [{"text": "ok"}], "usage": {"prompt_tokens": 5, "completion_tokens": 1}}).encode()


def _headers(items: dict[str, str], end: bool = False) -> pb.HttpHeaders:
    values = [base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in items.items()]
    return pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=values), end_of_stream=end)


def _body(i: int) -> bytes:
    return json.dumps({"model": MODEL, "prompt": f"request {i} " + "lorem ipsum " * 150, "max_tokens": 8}).encode()


async def ext_proc_request(stub: pb_grpc.ExternalProcessorStub, i: int) -> float:
    """One request's stream as Envoy drives it; returns the seconds from the headers to the pick."""
    body = _body(i)
    call = stub.Process()
    start = time.perf_counter()
    await call.write(pb.ProcessingRequest(request_headers=_headers({":method": "POST", ":path": "/v1/completions",
                                                                   "content-type": "application/json"})))  # fmt: skip
    await call.write(pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True)))
    answer = await call.read()
    picked = time.perf_counter() - start
    if answer.WhichOneof("response") != "request_headers":
        raise RuntimeError(f"no pick: {answer}")
    await call.read()  # the body, echoed
    await call.write(
        pb.ProcessingRequest(response_headers=_headers({":status": "200", "content-type": "application/json"}))
    )
    await call.read()
    await call.write(pb.ProcessingRequest(response_body=pb.HttpBody(body=RESPONSE, end_of_stream=True)))
    await call.read()
    await call.done_writing()
    return picked


async def http_request(session: aiohttp.ClientSession, url: str, i: int) -> float:
    start = time.perf_counter()
    async with session.post(f"{url}/v1/pick", data=_body(i), headers={"content-type": "application/json"}) as resp:
        await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"/v1/pick answered {resp.status}")
    return time.perf_counter() - start


async def whole_request(session: aiohttp.ClientSession, urls: list[str], door: str, i: int) -> float:
    """A request answered by a pod: to one of `urls` in turn (the pods, or a door). Its prompt names
    the door: no door finds a prompt another door sent already cached on a pod."""
    url = urls[i % len(urls)]
    start = time.perf_counter()
    body = json.dumps({"model": MODEL, "prompt": f"{door} {i} " + "lorem ipsum " * 150, "max_tokens": 1})
    async with session.post(f"{url}/v1/completions", data=body, headers={"content-type": "application/json"}) as r:
        answer = await r.read()
        if r.status != 200 or not json.loads(answer).get("choices"):
            raise RuntimeError(f"{url} answered {r.status}: {answer[:200]!r}")
    return time.perf_counter() - start


async def run_whole(urls: dict[str, list[str]], n: int, concurrency: int) -> dict[str, dict[str, float]]:
    async with aiohttp.ClientSession() as session:
        for name, url in urls.items():
            for i in range(50):
                await whole_request(session, url, f"warm {name}", i)
        doors = {d: (lambda i, url=url, d=d: whole_request(session, url, d, i)) for d, url in urls.items()}
        return await _measure(doors, n, concurrency)


async def _measure(doors: dict[str, Any], n: int, concurrency: int) -> dict[str, dict[str, float]]:
    """Each door's latency from sequential requests, interleaved (request i at every door in turn,
    so a drift of the machine's load falls on all alike), and its rate under `concurrency`
    clients: n/2 requests in the doors' order, n/2 in the reverse order, the two rates averaged."""
    lat: dict[str, list[float]] = {name: [] for name in doors}
    for i in range(min(n, 500)):
        for name, one in doors.items():
            lat[name].append(await one(i))
    rates: dict[str, list[float]] = {name: [] for name in doors}
    for order in (list(doors), list(reversed(doors))):
        for name in order:
            counter = iter(range(n // 2))

            async def worker(one=doors[name], counter=counter) -> None:
                for i in counter:
                    await one(i)

            start = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            rates[name].append((n // 2) / (time.perf_counter() - start))
    out = {}
    for name, values in lat.items():
        values.sort()
        out[name] = {
            "p50_ms": statistics.median(values) * 1000,
            "p99_ms": values[int(len(values) * 0.99) - 1] * 1000,
            "decisions_per_s": statistics.mean(rates[name]),
        }
    return out


async def run(url: str, address: str, n: int, concurrency: int) -> dict[str, dict[str, float]]:
    async with grpc.aio.insecure_channel(address) as channel, aiohttp.ClientSession() as session:
        stub = pb_grpc.ExternalProcessorStub(channel)
        for _ in range(50):  # warm both doors (connections, the replica's first snapshot)
            await ext_proc_request(stub, -1)
            await http_request(session, url, -1)
        doors = {
            "http /v1/pick": lambda i: http_request(session, url, i),
            "ext_proc": lambda i: ext_proc_request(stub, i),
        }
        return await _measure(doors, n, concurrency)


def _table(title: str, rate: str, note: str, figures: dict[str, dict[str, float]]) -> None:
    print(f"\n{title:<18}{'p50 ms':>9}{'p99 ms':>9}{rate:>14}   ({note})")
    for door, f in figures.items():
        print(f"{door:<18}{f['p50_ms']:>9.2f}{f['p99_ms']:>9.2f}{f['decisions_per_s']:>14.0f}", flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--port", type=int, default=8460)
    ap.add_argument("--pods", type=int, default=4)
    ap.add_argument("--envoy", action="store_true", help="also whole requests through a real Envoy")
    args = ap.parse_args(argv)
    from serve_app.cli.launch import EppDeployment, LaunchSpec

    dep = EppDeployment.start(
        LaunchSpec(sim_pods=args.pods, port=args.port, ext_proc_port=args.port + 1, settings={"pick_api": True})
    )
    envoy = None
    try:
        figures = asyncio.run(run(dep.url, dep.ext_proc_address or "", args.requests, args.concurrency))
        _table("door", "decisions/s", f"1 replica, concurrency {args.concurrency}", figures)
        if args.envoy:
            from bench.real_envoy import RealEnvoy

            envoy = RealEnvoy(args.port + 2, args.port + 1, args.port + 3).start()
            pods = [p.url for p in dep.sim.pods]  # type: ignore[union-attr]
            urls = {"pods directly": pods, "http gateway": [dep.url], "envoy + ext_proc": [envoy.url]}
            whole = asyncio.run(run_whole(urls, args.requests, args.concurrency))
            _table("whole request", "requests/s", "max_tokens 1, simulated pods", whole)
    finally:
        if envoy is not None:
            envoy.stop()
        dep.stop()


if __name__ == "__main__":
    main()
