"""The ext_proc gRPC port: every gateway replica of a machine serves it, as they serve the HTTP port
(serve_app/gateway/ingress.py). gRPC's server sets SO_REUSEPORT on its listening socket (`grpc.so_reuseport`,
on by default on Linux, set here explicitly), so each replica's socket joins the port's group; the
kernel spreads new connections (each Envoy connection carries many streams) over the live replicas,
and a dead replica's socket leaves the group at once. The group has an owner, as the HTTP port's
has: a replica binds only under the per-port lock naming its deployment (`owned_port`), so another
Ray EPP, or any other process of the same user, can not silently share the port."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health_pb2_grpc

from serve_app.extproc.service import ExternalProcessor, Health
from serve_app.gateway.ingress import PortInUse, owned_port

if TYPE_CHECKING:
    from serve_app.gateway.core import GatewayCore

STOP_GRACE_S = 5.0  # streams under way get this long to finish when a replica stops
MAX_MESSAGE_BYTES = 16 * 1024 * 1024  # Envoy's chunks are 64 KiB at most; headers and metadata are small


class ExtProcServer:
    """One replica's gRPC server on the shared ext_proc port, in the group of `owner`."""

    def __init__(self, core: GatewayCore, host: str, port: int, owner: str) -> None:
        self.host, self.port, self.owner = host, port, owner
        self._core = core
        self._server: grpc.aio.Server | None = None

    async def start(self) -> None:
        server = grpc.aio.server(
            options=[
                ("grpc.so_reuseport", 1),
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ]
        )
        pb_grpc.add_ExternalProcessorServicer_to_server(ExternalProcessor(self._core), server)
        health_pb2_grpc.add_HealthServicer_to_server(Health(self._core), server)
        address = f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
        with owned_port(self.host, self.port, self.owner):
            try:
                server.add_insecure_port(address)
            except RuntimeError:  # gRPC says only "Failed to bind": say who holds the port
                raise PortInUse(self.host, self.port) from None
            await server.start()
        self._server = server

    @property
    def serving(self) -> bool:
        return self._server is not None

    async def stop(self) -> None:
        """Leave the port's group (new connections go to the other replicas), then give the
        streams under way STOP_GRACE_S to finish."""
        server, self._server = self._server, None
        if server is not None:
            with contextlib.suppress(Exception):
                await server.stop(STOP_GRACE_S)
