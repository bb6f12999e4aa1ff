"""A model server that answers at once: the yardstick for a router's own overhead.

POST /v1/completions and /v1/chat/completions return a ~2 KB JSON body immediately, or, with
"stream": true, `--chunks` SSE events `--chunk-ms` apart. /metrics serves a real vLLM page (a
test fixture) so routers that scrape see a healthy idle server; /v1/models and /health answer too.
Several ports in one process: `python -m bench.fake_worker --ports 9101 9102`."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from aiohttp import web

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "metrics" / "vllm_v1_qwen1.5_0.5b.prom"
MODEL = "fake-model"


def _answer(port: int) -> bytes:
    text = "lorem ipsum " * 150  # ~1.8 KB of text: a ~2 KB body in all
    return json.dumps(
        {
            "id": f"cmpl-{port}",
            "object": "text_completion",
            "model": MODEL,
            "choices": [{"index": 0, "text": text, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 8, "completion_tokens": 16, "total_tokens": 24},
        }
    ).encode()


def make_app(port: int, chunks: int, chunk_ms: float) -> web.Application:
    body = _answer(port)
    metrics = FIXTURE.read_bytes()
    models = json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]}).encode()
    headers = {"x-inference-pod": f"fake-{port}"}

    async def complete(request: web.Request) -> web.StreamResponse:
        payload = await request.json()
        if not payload.get("stream"):
            return web.Response(body=body, content_type="application/json", headers=headers)
        resp = web.StreamResponse(headers={**headers, "content-type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(chunks):
            event = {"id": "s", "object": "text_completion", "choices": [{"index": 0, "text": f" t{i}"}]}
            await resp.write(f"data: {json.dumps(event)}\n\n".encode())
            await asyncio.sleep(chunk_ms / 1000)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/completions", complete)
    app.router.add_post("/v1/chat/completions", complete)
    app.router.add_post("/generate", complete)
    app.router.add_get("/metrics", lambda r: web.Response(body=metrics, content_type="text/plain"))
    app.router.add_get("/v1/models", lambda r: web.Response(body=models, content_type="application/json"))
    app.router.add_get("/health", lambda r: web.Response(text="ok"))
    app.router.add_get("/get_model_info", lambda r: web.json_response({"model_path": MODEL}))
    app.router.add_get("/get_server_info", lambda r: web.json_response({}))
    return app


async def serve(ports: list[int], chunks: int, chunk_ms: float) -> None:
    runners = []
    for port in ports:
        runner = web.AppRunner(make_app(port, chunks, chunk_ms), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        runners.append(runner)
    print("ready", flush=True)
    await asyncio.Event().wait()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ports", type=int, nargs="+", required=True)
    p.add_argument("--chunks", type=int, default=20)
    p.add_argument("--chunk-ms", type=float, default=10.0)
    a = p.parse_args()
    asyncio.run(serve(a.ports, a.chunks, a.chunk_ms))


if __name__ == "__main__":
    main()
