"""One request's ext_proc stream: Envoy opens a stream per HTTP request and sends, in order, the
request headers, the body chunks (full-duplex streamed), then the response headers and the
response body chunks. This class turns each message into the messages Envoy awaits, calling the
gateway's own request path (`GatewayCore.enter` / `decide` / `pd_hand_off`, `Exchange`), so both
doors admit, schedule and tell the plugins alike.

What Envoy is told, and when (GIE's order in full-duplex mode: headers response, then body):
* nothing until the body's last chunk: the decision needs the body;
* then the request headers response (the pick as header and dynamic metadata, the P/D prefill
  header, client-sent routing headers removed) and the body, unchanged, as streamed chunks;
* or an ImmediateResponse (Envoy answers the client; the stream is over): the HTTP door's
  errors, the same statuses and OpenAI-shaped bodies (429 shed, 503 no pod / empty subset, ...);
* on the response path, each chunk back as it came, with the response's own headers
  (ResponseHeader plugins: session token) on the headers response; an upstream status of 400 or
  more is counted as an error under that status, as the HTTP door counts it.

Every inference API the HTTP door routes is routed here, told apart by the path (and read by the
same token views, serve_app/gateway/api_views.py) with the same route hooks (serve_app/gateway/route_hooks.py):
a Responses API follow-up is pinned to the pod that holds its conversation, a response is pinned
as its answer goes by, `GET` / `DELETE /v1/responses/{id}` go to the pod that made it, and the
Anthropic routes' errors are in Anthropic's shape. A traced request (serve_app/gateway/tracing.py) gets
the HTTP door's spans; its forward span's traceparent goes to the pod in the header mutation.

`close()` runs once when the stream ends however it ends: a decision whose response never came
(the client left, Envoy gave up) is still told complete, so ledgers keep no entry for it."""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import time
from typing import TYPE_CHECKING

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from scheduler import ErrorCode, LLMRequest, SchedulingResult
from scheduler.types import Endpoint
from serve_app.extproc import protocol as proto
from serve_app.gateway.api_views import COUNT_TOKENS_PATH, MESSAGES_PATH, RESPONSES_PATH, VIEWS
from serve_app.gateway.disagg import PD_PATHS
from serve_app.gateway.errors import GatewayError
from serve_app.gateway.exchange import Exchange
from serve_app.gateway.messages_route import MessagesRoute
from serve_app.gateway.parsing import ROUTING_HEADERS, ParsedRequest, parse_request
from serve_app.gateway.responses_route import ResponsesRoute, pinned_endpoint, unpin_response
from serve_app.gateway.route_hooks import RouteHooks
from serve_app.gateway.side_routes import DESTINATION_HEADER
from serve_app.gateway.tracing import NO_SPANS, NoSpans, RequestSpans

if TYPE_CHECKING:
    from serve_app.gateway.core import GatewayCore
    from serve_app.gateway.intake import Admission

log = logging.getLogger("ray_epp.extproc")
STORED_RESPONSE = RESPONSES_PATH + "/"  # GET / DELETE /v1/responses/{id}: at the pod that made it


def route_for(core: GatewayCore, path: str) -> RouteHooks | None:
    """The route hooks the HTTP door runs for `path` (None: the plain request path)."""
    if path == RESPONSES_PATH:
        return ResponsesRoute(core)
    if path in (MESSAGES_PATH, COUNT_TOKENS_PATH):
        return MessagesRoute()
    return None


class PickerStream:
    __slots__ = (
        "_body", "_core", "_entered", "_exchange", "_headers", "_parsed", "_path", "_result", "_route",
        "_size", "_spans", "_started", "_status", "_subset", "_tap", "_unpin", "decided", "stop",
    )  # fmt: skip

    def __init__(self, core: GatewayCore) -> None:
        self._core = core
        self._started = time.perf_counter()
        self._headers: dict[str, str] = {}
        self._path = ""
        self._body: list[bytes] = []
        self._size = 0
        self._subset: list[str] | None = None
        self._entered: Admission | None = None  # counted in the replica's in-flight limit
        self._parsed: ParsedRequest | None = None
        self._result: SchedulingResult | None = None
        self._exchange: Exchange | None = None
        self._status = 0
        self._route: RouteHooks | None = None
        self._tap: RouteHooks | None = None  # the route that reads a 200 answer as it goes by
        self._unpin: str | None = None  # a DELETE of this stored response: its pin goes on a 200
        self._spans: RequestSpans | NoSpans = NO_SPANS
        self.decided = False  # the request headers response has gone (or an ImmediateResponse)
        self.stop = False  # an ImmediateResponse went: nothing more to do on this stream

    @property
    def request(self) -> LLMRequest | None:
        return None if self._parsed is None else self._parsed.llm_request

    async def handle(self, msg: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
        """The messages to send back for one message from Envoy (possibly none yet)."""
        kind = msg.WhichOneof("request")
        try:
            if kind in ("request_headers", "request_body", "request_trailers"):
                hint = proto.subset_hint(msg)
                if hint is not None:
                    self._subset = hint
            if kind == "request_headers":
                return await self._request_headers(msg.request_headers)
            if kind == "request_body":
                return await self._request_body(msg.request_body)
            if kind == "request_trailers":
                out = [] if self.decided else await self._decide(end_of_stream=False)
                return [*out, proto.trailers_response(request_side=True)]
            if kind == "response_headers":
                return await self._response_headers(msg, msg.response_headers)
            if kind == "response_body":
                return await self._response_body(msg.response_body)
            if kind == "response_trailers":
                self._response_done()
                return [proto.trailers_response(request_side=False)]
            return []
        except GatewayError as err:
            self._core.count_error(self.request, err)
            self.stop = self.decided = True
            self._status = err.status
            if self._route is None:
                return [proto.immediate_error(err)]
            return [proto.immediate_response(self._route.error_response(err))]

    def close(self) -> None:
        """The stream is over: the decision's end is told once, and the replica's slot freed."""
        core = self._core
        if self._exchange is not None:
            self._exchange.close()
        elif self._result is not None and self.request is not None:
            core.tell_complete(self.request, self._result.target.name)  # decided, never answered
        self._result = None
        if self._entered is not None:
            self._entered.leave()
            self._entered = None
        self._spans.finish(self._status or None)

    # ---- the request path ------------------------------------------------------------------
    async def _request_headers(self, headers: pb.HttpHeaders) -> list[pb.ProcessingResponse]:
        core = self._core
        self._headers, size = proto.header_map(headers)
        self._path = self._headers.get(":path", "").split("?", 1)[0]
        core.intake.check_headers(self._headers, size)
        self._entered = core.intake.enter(core.intake.client_of(self._headers, None))
        if core.tracing is not None:
            method = self._headers.get(":method", "POST")
            self._spans = core.tracing.begin(self._headers, self._path, method) or NO_SPANS
        await core.ensure_ready()
        if headers.end_of_stream:  # no body: not an inference request
            return await self._bodiless()
        if self._path not in VIEWS:
            raise GatewayError(404, f"{self._path or 'the request'} is not an inference route of this pool")
        self._route = route_for(core, self._path)
        return []

    async def _request_body(self, body: pb.HttpBody) -> list[pb.ProcessingResponse]:
        if self.decided:  # more body after the decision: pass it through
            return proto.request_body_responses(body.body, body.end_of_stream)
        limit = self._core.settings.max_body_bytes
        self._size += len(body.body)
        if self._size > limit:
            raise GatewayError(413, f"request body of over {self._size} bytes exceeds the limit of {limit}")
        self._body.append(body.body)
        if body.end_of_stream:
            return await self._decide(end_of_stream=True)
        return []

    async def _decide(self, end_of_stream: bool) -> list[pb.ProcessingResponse]:
        core = self._core
        raw = b"".join(self._body)
        self._body = []
        headers = {k: v for k, v in self._headers.items() if not k.startswith(":")}
        self._parsed = parsed = parse_request(raw, headers, self._path, core.settings, core.known_models())
        if self._route is not None:
            await self._route.prepare(parsed)
        req = parsed.llm_request
        self._spans.admission(req)
        allowed = self._allowed()
        if allowed is not None:  # a route's own exclusions stay
            outside = frozenset(ep.name for ep in core.view.endpoints if ep.host_port not in allowed)
            req.excluded_endpoints = req.excluded_endpoints | outside
        try:
            await core.enter(parsed, None, len(raw), self._started)
            self._spans.schedule(0)
            try:
                result = await core.decide(req, None)
            except GatewayError as err:
                if allowed is not None and err.code == ErrorCode.INTERNAL.value:  # the filters left none
                    raise _ineligible(f"no endpoint of the subset can serve the request: {err.message}") from None
                raise
        finally:
            core.settle(req)
        self._result = result
        self._spans.decided(result)
        targets = result.primary.target_endpoints
        if allowed is not None:
            targets = [ep for ep in targets if ep.host_port in allowed]
            if not targets:  # a pod the profile actors know and this replica's view not yet
                raise _ineligible("the pick fell outside the subset hint")
        set_headers: dict[str, str] = {}
        if result.prefill_profile_name is not None and self._path in PD_PATHS:
            self._spans.prefill(result, set_headers)
            await core.pd_hand_off(req, result, self._path, raw, set_headers, None, mode="sidecar")
        self._spans.forward(targets[0], set_headers)  # the pod gets the forward span's traceparent
        destination = ",".join(ep.host_port for ep in targets)  # the pick, then its fallbacks
        set_headers[DESTINATION_HEADER] = destination
        remove = sorted(h for h in ROUTING_HEADERS if h in self._headers and h not in set_headers)
        self.decided = True
        return [
            proto.request_headers_response(proto.header_mutation(set_headers, remove), destination),
            *proto.request_body_responses(raw, end_of_stream),
        ]

    def _allowed(self) -> set[str] | None:
        """The subset hint's endpoints that are in the pool; None without a hint. An empty or
        wholly ineligible hint is a 503, as the protocol asks."""
        if self._subset is None:
            return None
        if not self._subset:
            raise _ineligible("the subset hint lists no endpoint")
        allowed = set(self._subset)
        if not any(ep.host_port in allowed for ep in self._core.view.endpoints):
            shown = ", ".join(self._subset[:5]) + (" ..." if len(self._subset) > 5 else "")
            raise _ineligible(f"no endpoint of the subset hint ({shown}) is a ready endpoint of the pool")
        return allowed

    async def _bodiless(self) -> list[pb.ProcessingResponse]:
        """A request without a body (GET /v1/models, a probe): a Responder's answer (as the HTTP
        door gives it); a stored response (`GET` / `DELETE /v1/responses/{id}`, `POST
        /v1/responses/{id}/cancel`) at the pod that made it; else any ready endpoint of the
        subset, as GIE routes one. No plugin hears of it."""
        core = self._core
        method = self._headers.get(":method", "GET")
        for responder in core.responders:
            answer = responder.respond(method, self._path, core.view.endpoints)
            if answer is not None:
                self.stop = self.decided = True
                if 200 <= answer.status < 300:
                    return [proto.immediate(answer.status, _json(answer.body))]
                return [proto.immediate_error(GatewayError(answer.status, str(answer.body)))]
        allowed = self._allowed()
        if self._path.startswith(STORED_RESPONSE):  # {id}, or {id}/cancel
            response_id, _, action = self._path.removeprefix(STORED_RESPONSE).partition("/")
            pod = await pinned_endpoint(core, response_id, "response_id")
            if allowed is not None and pod.host_port not in allowed:
                raise _ineligible(f"response {response_id!r} is stored on {pod.host_port}, outside the subset hint")
            pool = [pod]
            if method == "DELETE" and not action:
                self._unpin = response_id
        else:
            pool = [ep for ep in core.view.endpoints if allowed is None or ep.host_port in allowed]
        if not pool:
            raise GatewayError(503, "no ready model server in the pool", code=ErrorCode.SERVICE_UNAVAILABLE.value)
        pick = random.choice(pool).host_port
        self.decided = True
        return [proto.request_headers_response(proto.header_mutation({DESTINATION_HEADER: pick}), pick)]

    # ---- the response path -----------------------------------------------------------------
    async def _response_headers(
        self, msg: pb.ProcessingRequest, headers: pb.HttpHeaders
    ) -> list[pb.ProcessingResponse]:
        got, _ = proto.header_map(headers)
        try:
            self._status = int(got.get(":status", "200"))
        except ValueError:
            self._status = 0
        if self._unpin is not None and self._status == 200:  # the pod deleted the response
            await unpin_response(self._core, self._unpin)
        req, result = self.request, self._result
        set_headers: dict[str, str] = {}
        if req is not None and result is not None and self._parsed is not None and self._exchange is None:
            if self._status >= 400:  # the model server's own error: counted with its status, as GIE does
                self._core.metrics.error(req, str(self._status))
            result = self._served(req, result, proto.served_endpoint(msg))
            target = result.target
            streaming = self._parsed.stream and self._status == 200
            self._exchange = Exchange.open(self._core, req, target.name, self._started, streaming)
            self._tap = self._route if self._status == 200 else None
            set_headers = self._core.lifecycle.response_headers(req, result)
            set_headers[DESTINATION_HEADER] = target.host_port
        out = [proto.response_headers_response(proto.header_mutation(set_headers))]
        if headers.end_of_stream:
            self._response_done()
        return out

    async def _response_body(self, body: pb.HttpBody) -> list[pb.ProcessingResponse]:
        if self._exchange is not None:
            if self._tap is not None and body.body:  # before the client gets it (a response's pin)
                await self._tap.answered(self._exchange.endpoint, body.body)
            self._exchange.chunk(body.body)
        out = proto.response_body_responses(body.body, body.end_of_stream)
        if body.end_of_stream:
            self._response_done()
        return out

    def _response_done(self) -> None:
        if self._exchange is not None:
            self._exchange.end(self._status == 200)
        self.close()

    def _served(self, req: LLMRequest, result: SchedulingResult, served: str | None) -> SchedulingResult:
        """The decision as the data plane carried it out: when a fallback served, the plugins move
        the request from the pick to it (ResponseComplete there, PreRequest here), as the HTTP
        door does when it retries on another endpoint."""
        target = result.target
        if served is None or served == target.host_port:
            return result
        ep = _by_host_port(result.primary.target_endpoints, served) or _by_host_port(self._core.view.endpoints, served)
        if ep is None:
            log.warning("the data plane says %s served request %s, not an endpoint of the pool", served, req.request_id)
            return result
        self._core.tell_complete(req, target.name)
        primary = dataclasses.replace(result.primary, target_endpoints=[ep])
        profiles = {**result.profile_results, result.primary_profile_name: primary}
        moved = dataclasses.replace(result, profile_results=profiles)
        self._core.tell_pre_request(req, moved)
        self._result = moved
        return moved


def _by_host_port(endpoints: list[Endpoint], host_port: str) -> Endpoint | None:
    return next((ep for ep in endpoints if ep.host_port == host_port), None)


def _ineligible(message: str) -> GatewayError:
    return GatewayError(503, message, code=ErrorCode.SERVICE_UNAVAILABLE.value)


def _json(body: object) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()
