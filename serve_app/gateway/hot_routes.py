"""The routes that carry nearly all traffic, served on the shared port without FastAPI's stack.

POST /v1/completions and /v1/chat/completions go from uvicorn straight to `GatewayCore.handle`,
and POST /v1/pick (the decision for a proxy in front, when `pick_api` is on) to `side_routes.pick`.
FastAPI's routing, its middleware (server errors, exception telemetry, body limit, exit stack) and
its endpoint machinery took about a third of the replica's CPU per request (docs/BENCHMARKS.md,
"What does the gateway add per request, against SMG and a Serve forwarder?"; docs/decisions/0009) and do nothing these
routes need: the core reads the body within its own limits and answers its own errors in OpenAI's
shape; an unexpected exception gets the app's 500 (`errors.internal_error`). Every other request,
and these paths with another method, go to the FastAPI app as before; so does every request that
comes through Serve's proxy. Middleware added to the app does not see these routes: a door
check belongs in `RequestIntake`, which both paths run. `hot_routes: false` in the gateway
settings sends them through FastAPI too."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.requests import Request

from serve_app.gateway import side_routes
from serve_app.gateway.errors import internal_error

if TYPE_CHECKING:
    from serve_app.gateway.core import GatewayCore


async def _pick(core: GatewayCore, request: Request, _path: str) -> Any:
    return await side_routes.pick(core, request)


async def _forward(core: GatewayCore, request: Request, path: str) -> Any:
    return await core.handle(request, path)


HOT_PATHS = {"/v1/completions": _forward, "/v1/chat/completions": _forward, "/v1/pick": _pick}


class HotRoutes:
    """An ASGI app: the hot routes to `core`, anything else to `app`."""

    def __init__(self, app: Any, core: GatewayCore) -> None:
        self._app = app
        self._core = core

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        path = scope.get("path")
        route = HOT_PATHS.get(path) if scope["type"] == "http" and scope["method"] == "POST" else None
        if route is None or scope.get("root_path"):
            await self._app(scope, receive, send)
            return
        request = Request(scope, receive)
        try:
            response = await route(self._core, request, path)
        except Exception as exc:  # a bug: the same 500 the app's handler gives, logged
            response = await internal_error(request, exc)
        await response(scope, receive, send)
