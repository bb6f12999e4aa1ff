"""The HTTP front door: the Ray Serve deployment with a FastAPI ingress whose routes hand each
OpenAI request to `GatewayCore` (serve_app/gateway/core.py). Any number of replicas share the
same actors, hence the same scheduling state.

No `from __future__ import annotations` here: FastAPI reads the routes' annotations at run time."""

import os
from typing import Any

import ray
from fastapi import FastAPI, Request
from ray import serve
from starlette.responses import JSONResponse, Response

from serve_app.admin.api import admin_router
from serve_app.gateway import side_routes
from serve_app.gateway.core import GatewayCore
from serve_app.gateway.errors import answer_errors_in_openai_shape
from serve_app.gateway.hot_routes import HotRoutes
from serve_app.gateway.ingress import SharedPortServer
from serve_app.gateway.messages_route import MessagesRoute
from serve_app.gateway.responses_route import ResponsesRoute

GATEWAY_SERVICE = "ray-epp-gateway"  # /health names the service, so launchers find our replicas
app = FastAPI(title="Ray EPP gateway", docs_url=None, redoc_url=None, openapi_url=None)
answer_errors_in_openai_shape(app)
app.include_router(admin_router(lambda: serve.get_replica_context().servable_object.core.admin))


def deployment_owner() -> str:
    """The shared port's owner name for this replica: its Ray cluster and Serve deployment, so its
    siblings and successors join its port group and any other gateway is refused."""
    context, cluster = serve.get_replica_context(), ray.get_runtime_context().gcs_address
    return f"ray cluster {cluster}, Serve deployment {context.app_name}/{context.deployment}"


# Serve's drain counts only requests that came through Serve, polled every wait loop (2 s by
# default, and it sleeps one before the first look); the shared port's own requests are drained by
# the destructor (SharedPortServer.stop). A short loop takes ~2 s off every stop and downscale.
@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=2048, graceful_shutdown_wait_loop_s=0.1)
@serve.ingress(app)
class Gateway:
    """`ingress` ({"host", "port"}): this replica also serves the app on that shared port (see
    serve_app/gateway/ingress.py), the gateway's address. Without it, only Serve's proxy reaches it. With
    an `ext_proc_port` too, it serves GIE's Endpoint Picker Protocol (Envoy ext_proc over gRPC) on
    that shared port as well (serve_app/extproc/)."""

    async def __init__(
        self,
        config: dict,
        settings: dict,
        datastore: Any,
        profile_actors: dict,
        hub: Any = None,
        ingress: dict | None = None,
        decision_log: Any = None,
    ) -> None:
        self.core = GatewayCore(config, settings, datastore, profile_actors, hub, decision_log)
        self._ingress: SharedPortServer | None = None
        self._ext_proc: Any = None
        if ingress is not None:
            owner = deployment_owner()
            self._ingress = SharedPortServer(
                HotRoutes(app, self.core) if self.core.settings.hot_routes else app,
                ingress["host"],
                int(ingress["port"]),
                lambda: serve.get_replica_context().servable_object is self,
                self.core.settings.keep_alive_timeout_s,
                owner,
                self.core.settings.client_max_connections,
            )
            await self._ingress.start()
            if ingress.get("ext_proc_port"):
                from serve_app.extproc.server import ExtProcServer  # gRPC only for a gateway that serves it

                self._ext_proc = ExtProcServer(self.core, ingress["host"], int(ingress["ext_proc_port"]), owner)
                await self._ext_proc.start()

    def check_health(self) -> None:
        """Serve restarts a replica whose shared-port server has stopped."""
        if self._ingress is not None and not self._ingress.serving:
            raise RuntimeError(f"the gateway's HTTP server on port {self._ingress.port} is not serving")

    async def __del__(self) -> None:
        if getattr(self, "_ext_proc", None) is not None:
            await self._ext_proc.stop()
        if getattr(self, "_ingress", None) is not None:
            await self._ingress.stop()

    @app.post("/v1/completions")
    async def completions(self, request: Request) -> Response:
        return await self.core.handle(request, "/v1/completions")

    @app.post("/v1/chat/completions")
    async def chat_completions(self, request: Request) -> Response:
        return await self.core.handle(request, "/v1/chat/completions")

    @app.post("/v1/responses")
    async def responses(self, request: Request) -> Response:
        return await ResponsesRoute.create(self.core, request)

    @app.get("/v1/responses/{response_id}")
    async def get_response(self, request: Request, response_id: str) -> Response:
        return await ResponsesRoute.stored(self.core, request, response_id)

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(self, request: Request, response_id: str) -> Response:
        return await ResponsesRoute.stored(self.core, request, response_id)

    @app.post("/v1/responses/{response_id}/cancel")
    async def cancel_response(self, request: Request, response_id: str) -> Response:
        return await ResponsesRoute.stored(self.core, request, response_id, "/cancel")

    # the APIs routed by load alone (serve_app/gateway/api_views.py, LOAD_VIEWS)
    @app.post("/v1/embeddings")
    @app.post("/pooling")
    @app.post("/classify")
    @app.post("/score")
    @app.post("/v1/score")
    @app.post("/rerank")
    @app.post("/v1/rerank")
    @app.post("/v2/rerank")
    @app.post("/tokenize")
    @app.post("/detokenize")
    @app.post("/v1/audio/transcriptions")  # multipart forms (serve_app/gateway/form_fields.py)
    @app.post("/v1/audio/translations")
    async def load_routed(self, request: Request) -> Response:
        return await self.core.handle(request, request.scope["route"].path)

    @app.post("/v1/messages")
    @app.post("/v1/messages/count_tokens")
    async def anthropic_messages(self, request: Request) -> Response:
        return await MessagesRoute.create(self.core, request, request.scope["route"].path)

    @app.post("/v1/pick")
    async def pick(self, request: Request) -> Response:
        return await side_routes.pick(self.core, request)

    @app.get("/v1/models")
    async def models(self) -> Response:
        return await side_routes.models(self.core)

    @app.get("/health")
    async def health(self) -> Response:
        # pid and replica (its Ray actor's name, in namespace "serve") say which replica answered:
        # all of them share one port.
        replica = serve.get_replica_context().replica_id.to_full_id_str()
        node = ray.get_runtime_context().get_node_id()  # several nodes of one machine share its port
        body = {"status": "ok", "service": GATEWAY_SERVICE, "pid": os.getpid(), "replica": replica, "node_id": node}
        return JSONResponse(body)

    @app.get("/ready")
    async def ready(self) -> Response:
        return await side_routes.ready(self.core)

    @app.get("/metrics")
    async def metrics(self) -> Response:
        return await side_routes.metrics(self.core)
