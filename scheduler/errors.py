"""Errors the scheduler raises, with GIE's codes and the HTTP status each maps to."""

from __future__ import annotations

from enum import StrEnum


class ErrorCode(StrEnum):
    """GIE's error codes (pkg/common/error); the value is what JSON and logs show."""

    BAD_REQUEST = "BadRequest"
    NOT_FOUND = "NotFound"
    RESOURCE_EXHAUSTED = "ResourceExhausted"
    INTERNAL = "Internal"
    SERVICE_UNAVAILABLE = "ServiceUnavailable"

    @property
    def http_status(self) -> int:
        return _HTTP_STATUS[self]


_HTTP_STATUS = {
    ErrorCode.BAD_REQUEST: 400,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.RESOURCE_EXHAUSTED: 429,
    ErrorCode.INTERNAL: 500,
    ErrorCode.SERVICE_UNAVAILABLE: 503,
}

# GIE's original name for the 429 code (pkg/epp/util/error at a70d66e5) is accepted wherever a code is parsed.
_ALIASES = {"InferencePoolResourceExhausted": ErrorCode.RESOURCE_EXHAUSTED}


def parse_error_code(text: str) -> ErrorCode:
    """Map a code name (GIE's, or its original alias) to an ErrorCode."""
    if text in _ALIASES:
        return _ALIASES[text]
    return ErrorCode(text)


class SchedulingError(Exception):
    """A request could not be scheduled; `code` says why and which HTTP status answers it."""

    def __init__(self, code: ErrorCode | str, message: str) -> None:
        self.code = code if isinstance(code, ErrorCode) else parse_error_code(code)
        self.message = message
        super().__init__(f"{self.code.value}: {message}")

    @property
    def http_status(self) -> int:
        return self.code.http_status

    def to_json(self) -> dict[str, dict[str, str]]:
        return {"error": {"code": self.code.value, "message": self.message}}

    def __reduce__(self):  # keep code and message across pickling (Ray moves errors between processes)
        return (SchedulingError, (self.code.value, self.message))


class ConfigError(ValueError):
    """An EndpointPickerConfig that can not be loaded; the message names the plugin and the field."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = errors
        super().__init__("invalid EndpointPickerConfig:\n" + "\n".join(f"  - {e}" for e in errors))
