"""Errors in OpenAI's shape: {"error": {"message", "type", "param", "code"}} with the right status.

Every answer the gateway gives itself has this shape, including its router's 404 / 405 and
FastAPI's validation errors (`answer_errors_in_openai_shape` installs the app's handlers). `code`
is one of GIE's codes (docs/DESIGN.md: BadRequest, NotFound, ResourceExhausted, Internal,
ServiceUnavailable) where one fits, else OpenAI's own (`invalid_api_key`, `model_not_found`)."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response

from scheduler import ErrorCode, SchedulingError

log = logging.getLogger("ray_epp.gateway")

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    431: "invalid_request_error",
    500: "internal_server_error",
    502: "bad_gateway",
    503: "service_unavailable",
    504: "timeout",
}

# The code an error gets when its raiser names none.
_CODES = {
    400: ErrorCode.BAD_REQUEST.value,
    401: "invalid_api_key",
    404: ErrorCode.NOT_FOUND.value,
    405: ErrorCode.BAD_REQUEST.value,
    408: ErrorCode.BAD_REQUEST.value,
    413: ErrorCode.BAD_REQUEST.value,
    429: ErrorCode.RESOURCE_EXHAUSTED.value,
    431: ErrorCode.BAD_REQUEST.value,
    500: ErrorCode.INTERNAL.value,
    502: ErrorCode.SERVICE_UNAVAILABLE.value,
    503: ErrorCode.SERVICE_UNAVAILABLE.value,
    504: ErrorCode.SERVICE_UNAVAILABLE.value,
}


class GatewayError(Exception):
    """An error the gateway answers itself, before or instead of forwarding."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code or _CODES.get(status, ErrorCode.INTERNAL.value if status >= 500 else "BadRequest")
        self.param = param
        self.headers = headers

    @classmethod
    def from_scheduling(cls, err: SchedulingError) -> GatewayError:
        return cls(err.http_status, err.message, code=err.code.value)

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": _TYPES.get(
                    self.status, "internal_server_error" if self.status >= 500 else "invalid_request_error"
                ),
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def bad_request(message: str, param: str | None = None) -> GatewayError:
    return GatewayError(400, message, code=ErrorCode.BAD_REQUEST.value, param=param)


def answer_errors_in_openai_shape(app: FastAPI) -> None:
    """The app's own errors in this shape too: its router's 404 / 405, a request FastAPI could not
    validate (400), and an unexpected exception (500, logged)."""
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(Exception, internal_error)


def no_route(method: str, path: str) -> GatewayError:
    """A path the gateway does not serve: a 404 that names it. Such a request is not passed on to
    a pod: a model server's own operational routes (vLLM's `/reset_prefix_cache`, `/sleep`,
    `/collective_rpc`…) must not be open to whoever can reach the gateway."""
    return GatewayError(
        404,
        f"{method} {path[:200]} is not a route of this gateway; it serves the inference APIs "
        "(README, 'Routes'), /v1/models, /health, /ready and /metrics",
    )


async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
    """The router's own 404 / 405 in OpenAI's shape, like every other answer of the gateway."""
    if exc.status_code == 404:
        return no_route(request.method, request.url.path).response()
    message = str(exc.detail)
    if exc.status_code == 405:
        message = f"{request.method} is not allowed on {request.url.path[:200]}"
    return GatewayError(exc.status_code, message, headers=getattr(exc, "headers", None)).response()


async def _validation_error(_request: Request, exc: RequestValidationError) -> Response:
    return bad_request(str(exc)[:500]).response()


async def internal_error(_request: Request, exc: Exception) -> Response:
    log.exception("unexpected error: %s", exc)
    return GatewayError(500, f"internal error: {type(exc).__name__}").response()
