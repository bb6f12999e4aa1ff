"""Dynamo's KV routing end to end: Dynamo's selection core (bench/dynamo_core.py) behind the
smallest HTTP forwarder that asks it, so `dynamo-kv` can stand in bench/e2e.py's table in front
of the same simulated pods as the real routers.

    python -m bench.dynamo_forwarder --port 8300 --pods pods.json

`pods.json` is the simulator's pod list with KV events on (`kvEvents: {endpoint, replay}` per pod):
each pod becomes a worker of one `SelectionService`, whose indexer subscribes to the pod's real
vLLM KV events over ZMQ, as Dynamo's frontend does with `--router-mode kv`. Per request on
`/v1/chat/completions` or `/v1/completions`:

1. the prompt's token ids as the pods compute them (chat messages flattened by the pods' template,
   4 characters a token: `ray_epp.simulator.tokens`; Dynamo's frontend tokenizes in process too);
2. `select_and_reserve` (Dynamo's cost over the indexer's overlaps and its active-sequence
   tracker, every default) books the request on the chosen pod;
3. the body goes to that pod unchanged and its answer streams back byte for byte;
   `prefill_complete` at the pod's first chunk (vLLM sends the first chunk after prefill),
   `free_reservation` when the answer ends or the client goes.

What it adds over Dynamo's router is one Python hop (aiohttp, one pooled session). What it leaves
out of Dynamo's frontend: its queue (`router_queue_threshold`, off by default), output-block
tracking (off by default), the request plane and discovery (the pods are fixed). Pods with their own
tokenizer (`--tokenizer`) are not supported: the token ids would not match their events."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from bench.dynamo_core import selection_request, selection_service, worker_record
from ray_epp.simulator.tokens import Prompt, flatten_messages, token_ids

ROUTES = ("/v1/chat/completions", "/v1/completions")
SUBSCRIBE_S = 0.5  # after registering the workers: ZMQ drops what a PUB sends before SUB has connected


def prompt_of(body: dict[str, Any]) -> Prompt:
    """The prompt as a simulated pod without a tokenizer sees it (engine_intake's `engine_prompt`)."""
    if "messages" in body:
        return flatten_messages(body["messages"])
    prompt = body.get("prompt")
    if isinstance(prompt, str) or (isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)):
        return prompt
    raise ValueError("the body has neither messages nor a prompt (a string or token ids)")


def workers_of(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One worker record per pod; ValueError when a pod does not publish KV events."""
    out = []
    for i, pod in enumerate(pods, start=1):
        kv = pod.get("kvEvents") or {}
        if not kv.get("endpoint"):
            raise ValueError(f"pod {pod.get('name', i)!r} publishes no KV events (start the pods with --kv-events)")
        out.append(worker_record(i, f"http://{pod['address']}:{pod['port']}", kv["endpoint"], kv.get("replay")))
    return out


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "dynamo_forwarder", "code": status}}, status=status)


class DynamoForwarder:
    def __init__(self, workers: list[dict[str, Any]]) -> None:
        self.workers = workers
        self.urls = {w["worker_id"]: w["endpoint"] for w in workers}
        self.ids = itertools.count()
        self.service: Any = None
        self.session: aiohttp.ClientSession | None = None
        self.ready = False

    async def start(self, app: web.Application) -> None:
        self.service = selection_service()
        for record in self.workers:
            await self.service.upsert_worker(record)
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=None)
        )
        await asyncio.sleep(SUBSCRIBE_S)
        self.ready = True

    async def stop(self, app: web.Application) -> None:
        if self.session is not None:
            await self.session.close()
        if self.service is not None:
            await self.service.shutdown_async()

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok") if self.ready else _error(503, "subscribing to the pods' KV events")

    async def forward(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw)
            tokens = token_ids(prompt_of(body))
        except (ValueError, TypeError, AttributeError) as err:
            return _error(400, f"not a completion request: {err}")
        rid = f"fwd-{next(self.ids)}"
        chosen = await self.service.select_and_reserve(selection_request(rid, tokens))
        url = self.urls[int(chosen["worker_id"])] + request.path
        assert self.session is not None
        resp: web.StreamResponse | None = None
        try:
            async with self.session.post(url, data=raw, headers={"Content-Type": "application/json"}) as up:
                resp = web.StreamResponse(status=up.status)
                resp.content_type = up.content_type
                await resp.prepare(request)
                first = True
                async for chunk in up.content.iter_any():
                    if first:
                        first = False
                        await self.service.prefill_complete(rid)
                    await resp.write(chunk)
                await resp.write_eof()
                return resp
        except aiohttp.ClientError as err:
            if resp is not None and resp.prepared:  # mid-answer: the client sees the stream end early
                return resp
            return _error(502, f"the pod at {url} failed: {err!r}")
        finally:
            await self.service.free_reservation(rid)


def make_app(workers: list[dict[str, Any]]) -> web.Application:
    fwd = DynamoForwarder(workers)
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.on_startup.append(fwd.start)
    app.on_cleanup.append(fwd.stop)
    app.router.add_get("/health", fwd.health)
    for route in ROUTES:
        app.router.add_post(route, fwd.forward)
    return app


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.dynamo_forwarder", description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--pods", type=Path, required=True, help="the simulator's pod list, KV events on")
    a = p.parse_args(argv)
    workers = workers_of(json.loads(a.pods.read_text()))
    web.run_app(make_app(workers), host=a.host, port=a.port, print=None, access_log=None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
