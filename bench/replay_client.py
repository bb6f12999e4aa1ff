"""The client side of an end-to-end run (bench/e2e.py): a workload replayed over HTTP at its arrival
times (streamed, over the chat, Responses or Messages API: bench/api_shapes.py), each request's TTFT,
ITL and E2E measured at the client, and every failure kept with why (a shed, an error status, a
stream cut, or how far a request got before the cut-off)."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import math
import time
from dataclasses import dataclass

import aiohttp

from bench.api_shapes import SESSION_HEADER, StreamReader, api_of, chains, request
from bench.metrics import ERROR, OK, SHED, Outcome
from ray_epp.simulator import SimRequest

PRIORITY_HEADER = "x-gateway-inference-priority"
KEEPALIVE_S = 2.0  # the client's idle connections, well under the gateway's keep_alive_timeout_s (65 s)
DROPPED_REASON_HEADER = "x-llm-d-request-dropped-reason"  # flow control's refusals carry it


def _url(base: str, path: str) -> str:
    if not base.startswith(("http://127.0.0.1", "http://localhost")):
        raise ValueError(f"benchmarks only target 127.0.0.1, not {base}")
    return base + path


def _previous_turns(workload: list[SimRequest], api: str) -> dict[str, SimRequest]:
    """request id → its session's previous turn in `workload`, for the turns that chain to it
    (bench/api_shapes.py); a session's first turn in the run starts its conversation afresh."""
    last: dict[str, SimRequest] = {}
    out = {}
    for req in workload:
        session = req.headers.get(SESSION_HEADER)
        if session is None or not chains(api, req):
            continue
        if session in last:
            out[req.request_id] = last[session]
        last[session] = req
    return out


async def replay(
    bases: list[str],
    workload: list[SimRequest],
    scale: float,
    timeout_s: float,
    warmup: int,
    to: list[str] | None = None,
    api: str = "chat",
    sources: list[str | None] | None = None,
) -> tuple[list[Outcome], list[str]]:
    """Sends request i to `to[i]` (default: the bases in turn) over `api` (bench/api_shapes.py),
    after `warmup` short requests; from the source address `sources[i]` when given, each address
    a client of its own with its own connection pool (None: the system's choice, one client)."""
    async with contextlib.AsyncExitStack() as stack:
        pools: dict[str | None, aiohttp.ClientSession] = {}
        for source in dict.fromkeys([None, *(sources or [])]):
            pools[source] = await stack.enter_async_context(_client(source))
        s = pools[None]
        warm_errors = []
        for i in range(warmup):
            body = {"model": workload[0].model if workload else "", "prompt": f"warm-up {i} " * 8, "max_tokens": 4}
            body.update(stream=True, stream_options={"include_usage": True})
            try:
                async with s.post(_url(bases[i % len(bases)], "/v1/completions"), json=body) as r:
                    await r.read()
                    if r.status != 200:
                        warm_errors.append(f"{r.status}")
            except aiohttp.ClientError as err:
                warm_errors.append(repr(err))
        t0 = time.perf_counter() + 0.05
        progress = {r.request_id: _Progress() for r in workload}  # how far each got, for the ones cut off
        previous = _previous_turns(workload, api)
        ids = {r.request_id: asyncio.get_running_loop().create_future() for r in workload}  # Responses ids
        to = to or [bases[i % len(bases)] for i in range(len(workload))]
        sources = sources or [None] * len(workload)
        tasks = [
            asyncio.create_task(
                _one(pools[src], base, req, t0, scale, progress[req.request_id], api, previous.get(req.request_id), ids)
            )
            for base, req, src in zip(to, workload, sources, strict=True)
        ]
        last = max((r.arrival_time for r in workload), default=0.0) * scale
        done, pending = await asyncio.wait(tasks, timeout=last + 0.05 + timeout_s)
        cut = time.perf_counter()
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    outcomes = []
    for req, task in zip(workload, tasks, strict=True):
        if task not in done:
            outcomes.append(progress[req.request_id].cut_off(req, cut, scale, timeout_s))
        elif task.exception() is not None:
            err = task.exception()
            outcomes.append(failure(req, reason=f"client {type(err).__name__}", detail=str(err)[:200]))
        else:
            outcomes.append(task.result())
    return outcomes, warm_errors


def _client(source: str | None) -> aiohttp.ClientSession:
    """A client with its own keep-alive pool, its connections from `source` (an address in
    127.0.0.0/8; None: the system's choice)."""
    # Idle connections are dropped before a server would close them (uvicorn, the gateway's
    # server: 5 s): else a request sent on one as it closes fails at once, ServerDisconnected.
    local = None if source is None else (_loopback(source), 0)
    conn = aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S, local_addr=local)
    return aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=None, sock_connect=10))


def _loopback(address: str) -> str:
    if ipaddress.ip_address(address) not in ipaddress.ip_network("127.0.0.0/8"):
        raise ValueError(f"benchmark clients send only from 127.0.0.0/8, not {address}")
    return address


@dataclass(slots=True)
class _Progress:
    """How far a request got, so one still open at the cut-off says whether it was queued,
    streaming slowly or stalled (its last chunk long before the cut)."""

    stage: str = "not sent"
    sent: float = math.nan
    first: float = math.nan
    last: float = math.nan
    tokens: int = 0

    def cut_off(self, req: SimRequest, cut: float, scale: float, timeout_s: float) -> Outcome:
        out = failure(req, reason=f"unfinished at cut-off ({self.stage})")
        out.ttft, out.output_tokens = (self.first - self.sent) / scale, self.tokens
        out.detail = f"{timeout_s:g} s wall after the last arrival; sent {cut - self.sent:.1f} s before it"
        if self.tokens:
            out.detail += f", {self.tokens} token chunks, the last {cut - self.last:.1f} s before it"
        return out


def failure(req: SimRequest, status: str = ERROR, reason: str = "", detail: str = "", e2e: float = math.nan) -> Outcome:
    return Outcome(
        req.request_id, status, req.arrival_time, req.priority, req.model, e2e=e2e,
        prompt_tokens=req.prompt_tokens, reason=reason, detail=detail,
    )  # fmt: skip


async def _refused(req: SimRequest, r: aiohttp.ClientResponse, after: float, scale: float) -> Outcome:
    """A 429 (shed) or another status (error), keyed by the status, the gateway's error `code`
    and flow control's dropped reason, so TTL expiry, a full queue and upstream failures part."""
    raw = await r.read()
    code, message = "", raw[:200].decode(errors="replace")
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        err = json.loads(raw)["error"]
        code, message = str(err.get("code") or ""), str(err.get("message") or "")
    dropped = r.headers.get(DROPPED_REASON_HEADER, "")
    reason = " ".join(x for x in (f"http {r.status}", code, dropped) if x)
    status = SHED if r.status == 429 else ERROR
    return failure(req, status, reason, f"{message[:200]} (after {after:.1f} s wall)", e2e=after / scale)


async def _one(
    s: aiohttp.ClientSession,
    base: str,
    req: SimRequest,
    t0: float,
    scale: float,
    progress: _Progress | None = None,
    api: str = "chat",
    previous: SimRequest | None = None,
    ids: dict[str, asyncio.Future[str | None]] | None = None,
) -> Outcome:
    """One request over `api`; a turn that chains to `previous` waits for its response id (in
    `ids`, where this turn leaves its own, or None when it fails)."""
    reader = StreamReader(api_of(api, req))
    try:
        return await _send(s, base, req, t0, scale, progress, api, previous, ids, reader)
    finally:
        mine = None if ids is None else ids.get(req.request_id)
        if mine is not None and not mine.done():
            mine.set_result(reader.response_id if reader.done and reader.error is None else None)


async def _send(
    s: aiohttp.ClientSession,
    base: str,
    req: SimRequest,
    t0: float,
    scale: float,
    progress: _Progress | None,
    api: str,
    previous: SimRequest | None,
    ids: dict[str, asyncio.Future[str | None]] | None,
    reader: StreamReader,
) -> Outcome:
    p = _Progress() if progress is None else progress
    await asyncio.sleep(max(0.0, t0 + req.arrival_time * scale - time.perf_counter()))
    chained = None
    if previous is not None and ids is not None:
        p.stage = "waiting for the previous turn's answer"
        response_id = await ids[previous.request_id]
        if response_id is None:
            return failure(req, reason="previous turn failed", detail=f"{previous.request_id} left no response id")
        chained = (previous, response_id)
    path, body = request(api, req, chained)
    headers = dict(req.headers)
    if req.priority:
        headers.setdefault(PRIORITY_HEADER, str(req.priority))
    sent = p.sent = time.perf_counter()
    first = last = math.nan
    finished = False
    p.stage = "no answer yet"
    try:
        async with s.post(_url(base, path), json=body, headers=headers) as r:
            if r.status != 200:
                return await _refused(req, r, time.perf_counter() - sent, scale)
            p.stage = "headers, no token yet"
            buf = b""
            async for chunk in r.content.iter_any():
                now = time.perf_counter()
                buf += chunk
                *events, buf = buf.split(b"\n\n")
                for ev in events:  # `data:` (after an `event:` line, in the Responses and Anthropic streams)
                    data = next((ln[5:].strip() for ln in ev.split(b"\n") if ln.startswith(b"data:")), None)
                    if data is None:
                        continue
                    if data == b"[DONE]":
                        finished = True
                        continue
                    texted = reader.feed(json.loads(data))
                    if reader.error is not None:  # the gateway ends a stream its upstream broke with an error event
                        err = reader.error
                        reason = f"stream error event {err.get('code') or ''}".rstrip()
                        after = f"(after {now - sent:.1f} s wall, {'no' if math.isnan(first) else 'some'} tokens)"
                        return failure(req, reason=reason, detail=f"{str(err.get('message'))[:200]} {after}")
                    if texted:
                        if math.isnan(first):
                            first = p.first = now
                            p.stage = "streaming"
                        last = p.last = now
                        p.tokens += 1
            finished = finished or reader.done
    except (TimeoutError, aiohttp.ClientError, json.JSONDecodeError) as err:
        # before the answer's head: connect error, reset; after it: the stream was cut mid-way
        where = "client" if p.stage == "no answer yet" else "stream cut:"
        after = time.perf_counter() - sent
        return failure(req, reason=f"{where} {type(err).__name__}", detail=f"{err!s:.200} (after {after:.1f} s wall)")
    if not finished or math.isnan(first):
        reason = "stream ended without [DONE]" if not finished else "stream without tokens"
        return failure(req, reason=reason, detail=f"after {time.perf_counter() - sent:.1f} s wall")
    prompt_tokens, out_tokens, cached_tokens = reader.counts()
    return Outcome(
        request_id=req.request_id,
        status=OK,
        arrival=req.arrival_time,
        priority=req.priority,
        model=req.model,
        ttft=(first - sent) / scale,
        itl=(last - first) / (out_tokens - 1) / scale if out_tokens > 1 else math.nan,
        e2e=(last - sent) / scale,
        prompt_tokens=prompt_tokens or req.prompt_tokens,
        cached_tokens=cached_tokens,
        output_tokens=out_tokens,
    )
