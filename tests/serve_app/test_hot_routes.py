"""The shared port's hot routes: POST to the two completion paths reaches the gateway core without
FastAPI; anything else reaches the FastAPI app; a bug in the core is the app's OpenAI-shaped 500.
(Every test of tests/serve_app/test_gateway_e2e.py goes through them on the real gateway.)"""

from __future__ import annotations

import httpx
import pytest
from fastapi import FastAPI
from starlette.responses import JSONResponse, Response

from serve_app.gateway.errors import answer_errors_in_openai_shape
from serve_app.gateway.hot_routes import HotRoutes


class Core:
    """The one method of GatewayCore the hot routes call, recording what it was given."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.seen: list[tuple[str, bytes, str]] = []

    async def handle(self, http, path: str) -> Response:
        if self.fail:
            raise RuntimeError("a bug")
        self.seen.append((path, await http.body(), http.headers["x-who"]))
        return JSONResponse({"from": "core"}, headers={"x-gateway-destination-endpoint": "127.0.0.1:1"})


def app_with_routes() -> FastAPI:
    app = FastAPI()
    answer_errors_in_openai_shape(app)

    @app.post("/v1/completions")
    @app.post("/v1/embeddings")
    async def fastapi_route() -> dict:
        return {"from": "fastapi"}

    return app


async def call(core: Core, method: str, path: str) -> httpx.Response:
    transport = httpx.ASGITransport(app=HotRoutes(app_with_routes(), core))
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
        return await client.request(method, path, content=b'{"prompt": "x"}', headers={"x-who": "client"})


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
async def test_a_completion_goes_to_the_core_with_its_path_body_and_headers(path):
    core = Core()
    resp = await call(core, "POST", path)
    assert resp.status_code == 200 and resp.json() == {"from": "core"}
    assert resp.headers["x-gateway-destination-endpoint"] == "127.0.0.1:1"
    assert core.seen == [(path, b'{"prompt": "x"}', "client")]


@pytest.mark.parametrize(
    ("method", "path", "status", "body"),
    [
        ("POST", "/v1/embeddings", 200, {"from": "fastapi"}),  # another route: the app's
        ("GET", "/v1/completions", 405, None),  # another method: the app's 405, OpenAI-shaped
        ("POST", "/v1/completions/", 307, None),  # the app's own slash redirect
    ],
)
async def test_everything_else_goes_to_the_app(method, path, status, body):
    core = Core()
    resp = await call(core, method, path)
    assert resp.status_code == status
    if body is not None:
        assert resp.json() == body
    if status == 405:
        assert set(resp.json()["error"]) == {"message", "type", "param", "code"}
    assert core.seen == []


async def test_a_bug_in_the_core_is_the_apps_openai_shaped_500():
    resp = await call(Core(fail=True), "POST", "/v1/completions")
    assert resp.status_code == 500
    assert resp.json()["error"]["message"] == "internal error: RuntimeError"
