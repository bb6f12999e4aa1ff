"""The best minimal Ray Serve forwarder (DESIGN.md's yardstick): throughput-optimised Serve with
direct ingress, a FastAPI ingress and one pooled aiohttp session, round-robin over the workers.
No scheduling at all. `python -m bench.serve_forwarder --port 8300 --workers http://127.0.0.1:9101`"""

import argparse
import itertools
import signal
import threading

from serve_app.cli.launch import serve_direct_ingress_env


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--workers", nargs="+", required=True)
    a = p.parse_args()
    serve_direct_ingress_env(a.port, 1)

    import aiohttp
    import ray
    from fastapi import FastAPI, Request
    from ray import serve
    from starlette.responses import Response, StreamingResponse

    app = FastAPI()

    @serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=2048)
    @serve.ingress(app)
    class Forwarder:
        def __init__(self, workers: list[str]) -> None:
            self.workers = itertools.cycle(workers)
            self.session: aiohttp.ClientSession | None = None

        @app.post("/v1/completions")
        async def completions(self, request: Request) -> Response:
            if self.session is None:
                self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
            body = await request.body()
            resp = await self.session.post(
                f"{next(self.workers)}/v1/completions", data=body, headers={"content-type": "application/json"}
            )
            if resp.headers.get("content-type", "").startswith("text/event-stream"):

                async def relay():
                    try:
                        async for chunk in resp.content.iter_any():
                            yield chunk
                    finally:
                        resp.release()

                return StreamingResponse(relay(), media_type="text/event-stream")
            data = await resp.read()
            resp.release()
            return Response(data, media_type="application/json")

        @app.get("/health")
        async def health(self) -> Response:
            return Response("ok")

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    serve.start(http_options={"host": "127.0.0.1", "port": a.port + 88})
    serve.run(Forwarder.bind(a.workers), name="fwd", route_prefix="/")
    print("ready", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    serve.shutdown()
    ray.shutdown()


if __name__ == "__main__":
    main()
