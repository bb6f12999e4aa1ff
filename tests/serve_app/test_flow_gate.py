"""The gateway replica's flow-control gate behind a real HTTP server (uvicorn on 127.0.0.1, no
Ray): queued until the pool opens, 429 on TTL and on a full band with llm-d's reason header, a
client that disconnects leaves the queue at once, and the queue's metrics."""

from __future__ import annotations

import asyncio
import contextlib
import socket

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from actors.metrics_hub import MetricsRecorder
from scheduler import Endpoint, LLMRequest, Metrics
from scheduler.config.flow_control import FlowControlSpec
from scheduler.flowcontrol.controller import FlowController
from scheduler.flowcontrol.types import Outcome
from scheduler.interfaces import SaturationDetector
from scheduler.plugins.flowcontrol.fcfs import FCFSOrderingPolicy
from scheduler.plugins.flowcontrol.global_strict import GlobalStrictFairnessPolicy
from serve_app.gateway.errors import GatewayError
from serve_app.gateway.flow_gate import QUEUE_DURATION, QUEUE_SIZE, FlowGate

EPS = [Endpoint(name="pod", metrics=Metrics())]


class Gate(SaturationDetector):
    type_name = "test-gate"

    def setup(self, handle) -> None:
        self.saturated = True

    def is_pool_saturated(self, endpoints):
        return self.saturated


def make_gate(endpoints: list[Endpoint] = EPS, **spec) -> tuple[FlowGate, Gate, MetricsRecorder]:
    policies = {
        "fcfs-ordering-policy": FCFSOrderingPolicy(),
        "global-strict-fairness-policy": GlobalStrictFairnessPolicy(),
    }
    detector, recorder = Gate(), MetricsRecorder()
    fc = FlowController(FlowControlSpec.model_validate(spec), [detector], policies.__getitem__)
    return FlowGate(fc, lambda: endpoints, recorder, lambda r: "m", str), detector, recorder


@contextlib.asynccontextmanager
async def serve(gate: FlowGate):
    async def handler(http: Request):
        body = await http.json()
        req = LLMRequest(request_id=body["id"], target_model="m", body={"model": "m", "prompt": "x"}, priority=-1,
                         headers=dict(http.headers))  # fmt: skip
        try:
            item = await gate.admit(req, http, 10)
        except GatewayError as err:
            return err.response()
        gate.settle(req)
        return JSONResponse({"queued_s": item.queued_s})

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(Starlette(routes=[Route("/", handler, methods=["POST"])]),
                                           host="127.0.0.1", port=port, log_level="warning"))  # fmt: skip
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            yield client
    finally:
        server.should_exit = True
        await task


def test_queued_then_dispatched_when_the_pool_opens():
    async def main():
        gate, detector, recorder = make_gate()
        async with serve(gate) as client:
            pending = asyncio.create_task(client.post("/", json={"id": "a"}))
            while gate.controller.size == 0:
                await asyncio.sleep(0.01)
            assert recorder.state()["gauges"][(QUEUE_SIZE, ("default-flow", "-1", "default", "m", "m"))] == 1.0
            await asyncio.sleep(0.1)
            assert not pending.done()
            detector.saturated = False  # the 10 ms tick finds the pool open
            answer = await pending
            assert answer.status_code == 200 and answer.json()["queued_s"] >= 0.1
        hist = recorder.state()["histograms"]
        assert (QUEUE_DURATION, ("default-flow", "-1", Outcome.DISPATCHED.value, "default", "m", "m")) in hist

    asyncio.run(main())


def test_ttl_and_a_full_band_answer_429_saying_which():
    async def main():
        gate, _, _ = make_gate(defaultRequestTTL="300ms", defaultNegativePriorityBand={"maxRequests": 1})
        async with serve(gate) as client:
            waiting = asyncio.create_task(client.post("/", json={"id": "a"}))
            while gate.controller.size == 0:
                await asyncio.sleep(0.01)
            full = await client.post("/", json={"id": "b"})
            assert full.status_code == 429 and full.headers["x-llm-d-request-dropped-reason"] == "rejected-saturated"
            assert (
                full.json()["error"]["code"] == "ResourceExhausted" and "queue full" in full.json()["error"]["message"]
            )
            expired = await waiting
            assert expired.status_code == 429, expired.text
            assert expired.headers["x-llm-d-request-dropped-reason"] == "rejected-ttl-expired"
            assert "timed out in queue" in expired.json()["error"]["message"]

    asyncio.run(main())


def test_no_endpoints_at_ttl_is_503():
    async def main():
        gate, _, _ = make_gate([], defaultRequestTTL="200ms")  # the pool is empty
        req = LLMRequest(request_id="a", target_model="m", body={"model": "m", "prompt": "x"}, priority=0)
        with pytest.raises(GatewayError) as err:
            await gate.admit(req, None, 1)
        assert (
            err.value.status == 503 and err.value.headers["x-llm-d-request-dropped-reason"] == "rejected-no-endpoints"
        )

    asyncio.run(main())


def test_a_client_that_disconnects_leaves_the_queue_at_once():
    async def main():
        gate, _, recorder = make_gate(defaultRequestTTL="30s")
        async with serve(gate) as client:
            with pytest.raises(httpx.ReadTimeout):
                await client.post("/", json={"id": "a"}, timeout=0.3)
            for _ in range(200):
                if gate.controller.size == 0:
                    break
                await asyncio.sleep(0.01)
            assert gate.controller.size == 0  # gone long before its 30 s TTL
        hist = recorder.state()["histograms"]
        assert (QUEUE_DURATION, ("default-flow", "-1", Outcome.EVICTED_CANCELLED.value, "default", "m", "m")) in hist
        assert recorder.state()["gauges"][(QUEUE_SIZE, ("default-flow", "-1", "default", "m", "m"))] == 0.0

    asyncio.run(main())
