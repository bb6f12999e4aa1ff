"""Anthropic's Messages API through the gateway (`/v1/messages`, `/v1/messages/count_tokens`):
scheduled over the same token view as chat (serve_app/gateway/api_views.py), forwarded as the client
wrote it, and the gateway's own errors on these routes in Anthropic's shape —
`{"type": "error", "error": {"type", "message"}}` — so an Anthropic client reads them as it reads
a model server's."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from serve_app.gateway.errors import GatewayError
from serve_app.gateway.parsing import ParsedRequest

if TYPE_CHECKING:
    from serve_app.gateway.core import GatewayCore

# Anthropic's error types by status (its API reference, "Errors"); other statuses by their class.
ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
}


def anthropic_error_type(status: int) -> str:
    return ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


class MessagesRoute:
    """The hooks of the Anthropic routes on the gateway's path (serve_app/gateway/route_hooks.py): nothing
    before or after, only the shape of an error."""

    @classmethod
    async def create(cls, core: GatewayCore, http: Request, path: str) -> Response:
        return await core.handle(http, path, cls())

    async def prepare(self, parsed: ParsedRequest) -> None:
        return None

    async def answered(self, endpoint: str, data: bytes) -> None:
        return None

    def error_response(self, err: GatewayError) -> Response:
        body = {"type": "error", "error": {"type": anthropic_error_type(err.status), "message": err.message}}
        return JSONResponse(body, status_code=err.status, headers=err.headers)
