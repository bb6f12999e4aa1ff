"""Errors in OpenAI's shape: {"error": {"message", "type", "param", "code"}} with the right status."""

from __future__ import annotations

from starlette.responses import JSONResponse

from scheduler import ErrorCode, SchedulingError

_TYPES = {
    400: "invalid_request_error",
    404: "not_found_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "internal_server_error",
    502: "bad_gateway",
    503: "service_unavailable",
    504: "timeout",
}


class GatewayError(Exception):
    """An error the gateway answers itself, before or instead of forwarding."""

    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param

    @classmethod
    def from_scheduling(cls, err: SchedulingError) -> GatewayError:
        return cls(err.http_status, err.message, code=err.code.value)

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": _TYPES.get(self.status, "error"),
                "param": self.param,
                "code": self.code or str(self.status),
            }
        }

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


def bad_request(message: str, param: str | None = None) -> GatewayError:
    return GatewayError(400, message, code=ErrorCode.BAD_REQUEST.value, param=param)
