"""What a route adds to the gateway's request path (`GatewayCore.handle`) without a path of its
own: a look at the parsed request before it is scheduled, at the answer as it goes by, and the
shape of the gateway's own errors. The
Responses API uses it to pin a follow-up to the pod that holds its conversation
(serve_app/gateway/responses_route.py); the Anthropic routes answer errors in Anthropic's shape
(serve_app/gateway/messages_route.py)."""

from __future__ import annotations

from typing import Protocol

from starlette.responses import Response

from serve_app.gateway.errors import GatewayError
from serve_app.gateway.parsing import ParsedRequest


class RouteHooks(Protocol):
    async def prepare(self, parsed: ParsedRequest) -> None:
        """Before admission: may narrow the endpoints (`excluded_endpoints`) or raise GatewayError."""

    async def answered(self, endpoint: str, data: bytes) -> None:
        """A piece of a 200 answer from `endpoint` (the whole body, or a stream's chunk), before
        the client gets it."""

    def error_response(self, err: GatewayError) -> Response:
        """The gateway's own error in the route's API shape (OpenAI's: `err.response()`)."""
