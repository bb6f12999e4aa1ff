"""The gRPC services a gateway replica serves for Envoy: `envoy.service.ext_proc.v3.ExternalProcessor`
(one `PickerStream` per stream) and the gRPC health protocol with the three services GIE's protocol
names.

Health, as the protocol defines it, without leader election: every replica is active (they share
the profile actors, hence one scheduling state), so `readiness` and the ext_proc service are
SERVING on every replica whose pool has a ready endpoint, and `liveness` (and the overall "" name)
whenever the replica answers. An unknown service name is NOT_FOUND, as the gRPC health protocol
asks."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from serve_app.extproc.stream import PickerStream

if TYPE_CHECKING:
    from serve_app.gateway.core import GatewayCore

log = logging.getLogger("ray_epp.extproc")

EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
LIVENESS = "liveness"
READINESS = "readiness"
WATCH_EVERY_S = 0.5  # how often a Watch looks for a change of status
FIRST_SNAPSHOT_WAIT_S = 2.0  # a Check on a new replica waits at most this for its first snapshot
Status = health_pb2.HealthCheckResponse.ServingStatus


class ExternalProcessor(pb_grpc.ExternalProcessorServicer):
    def __init__(self, core: GatewayCore) -> None:
        self._core = core

    async def Process(
        self, request_iterator: AsyncIterator[pb.ProcessingRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ProcessingResponse]:
        stream = PickerStream(self._core)
        try:
            async for msg in request_iterator:
                for response in await stream.handle(msg):
                    yield response
                if stream.stop:  # an ImmediateResponse: Envoy answers the client, the stream is done
                    return
        finally:  # however it ends: finished, Envoy gone, cancelled while queued or scheduling
            stream.close()


class Health(health_pb2_grpc.HealthServicer):
    def __init__(self, core: GatewayCore) -> None:
        self._core = core

    async def _status(self, service: str) -> int | None:
        if service in ("", LIVENESS):
            return Status.SERVING
        if service in (READINESS, EXT_PROC_SERVICE):
            core = self._core
            core.ensure_started()
            if not core.view.has_first:
                await core.view.wait_first(FIRST_SNAPSHOT_WAIT_S)
            return Status.SERVING if core.view.endpoints else Status.NOT_SERVING
        return None

    async def Check(
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> health_pb2.HealthCheckResponse:
        status = await self._status(request.service)
        if status is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return health_pb2.HealthCheckResponse(status=status)

    async def Watch(
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[health_pb2.HealthCheckResponse]:
        last = None
        while True:
            status = await self._status(request.service)
            if status is None:
                status = Status.SERVICE_UNKNOWN
            if status != last:
                last = status
                yield health_pb2.HealthCheckResponse(status=status)
            await asyncio.sleep(WATCH_EVERY_S)
