"""Load from the benchmark's own process: sequential latency, closed-loop throughput, streaming
time to first byte. Bounded in count and time; only 127.0.0.1 targets."""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass

import aiohttp


@dataclass
class Latencies:
    values_ms: list[float]

    def pct(self, q: float) -> float:
        v = sorted(self.values_ms)
        return v[min(len(v) - 1, int(q * len(v)))] if v else float("nan")

    @property
    def p50(self) -> float:
        return statistics.median(self.values_ms) if self.values_ms else float("nan")


def _check_local(url: str) -> None:
    if not url.startswith(("http://127.0.0.1", "http://localhost")):
        raise ValueError(f"benchmarks only target 127.0.0.1, not {url}")


async def sequential(url: str, body: bytes, n: int, warmup: int = 50) -> Latencies:
    _check_local(url)
    out = []
    async with aiohttp.ClientSession() as s:
        for i in range(n + warmup):
            t = time.perf_counter()
            async with s.post(url, data=body, headers={"content-type": "application/json"}) as r:
                await r.read()
                if r.status != 200:
                    raise RuntimeError(f"{url} answered {r.status}")
            if i >= warmup:
                out.append((time.perf_counter() - t) * 1000)
    return Latencies(out)


async def closed_loop(url: str, body: bytes | list[bytes], concurrency: int, seconds: float) -> tuple[float, int]:
    """Requests per second with `concurrency` clients, each sending as soon as it has an answer.
    `body`: one body for every request, or a list the requests take in turn."""
    _check_local(url)
    done = errors = 0
    deadline = time.perf_counter() + seconds
    bodies = [body] if isinstance(body, bytes) else body
    turn = 0

    async def client(s: aiohttp.ClientSession) -> None:
        nonlocal done, errors, turn
        while time.perf_counter() < deadline:
            body = bodies[turn % len(bodies)]
            turn += 1
            try:
                async with s.post(url, data=body, headers={"content-type": "application/json"}) as r:
                    await r.read()
                    if r.status == 200:
                        done += 1
                    else:
                        errors += 1
            except aiohttp.ClientError:
                errors += 1

    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn) as s:
        start = time.perf_counter()
        await asyncio.gather(*(client(s) for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    return done / elapsed, errors


async def stream_ttfb(url: str, body: bytes, n: int) -> tuple[Latencies, Latencies]:
    """Time to the first SSE event and to the whole stream, per request."""
    _check_local(url)
    first, total = [], []
    async with aiohttp.ClientSession() as s:
        for _ in range(n):
            t = time.perf_counter()
            async with s.post(url, data=body, headers={"content-type": "application/json"}) as r:
                got_first = False
                async for _chunk in r.content.iter_any():
                    if not got_first:
                        first.append((time.perf_counter() - t) * 1000)
                        got_first = True
            total.append((time.perf_counter() - t) * 1000)
    return Latencies(first), Latencies(total)
