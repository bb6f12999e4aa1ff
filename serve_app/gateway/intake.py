"""What a request must pass at a gateway replica's door, before it is parsed or scheduled: the API
key, the size of its headers and body, the time its body may take, the replica's limit of requests
in flight, and whether its caller may see the decision trace."""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Mapping

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from serve_app.gateway.api_views import ANTHROPIC_PATHS
from serve_app.gateway.errors import GatewayError, bad_request
from serve_app.gateway.settings import GatewaySettings

SHED_RETRY_AFTER_S = "1"


class RequestIntake:
    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings
        self.in_flight = 0  # requests of the OpenAI routes and /v1/pick this replica is serving
        self._debug_token = settings.debug_token.encode() if settings.debug_token else None
        self._api_key = f"Bearer {settings.api_key}".encode() if settings.api_key else None
        self._bare_key = settings.api_key.encode() if settings.api_key else b""

    def wants_trace(self, http: Request) -> bool:
        """The decision trace names pods, addresses and scores: only for the operator's token
        (or for anyone asking, when `debug_trace` opens it)."""
        value = http.headers.get(self.settings.debug_header)
        if not value:
            return False
        if self._debug_token is not None and hmac.compare_digest(value.encode(), self._debug_token):
            return True
        return self.settings.debug_trace

    def check_head(self, http: Request) -> None:
        """What can be refused before reading the body: the API key, the headers' size, a
        declared body over the limit."""
        anthropic = http.url.path in ANTHROPIC_PATHS
        self.check_headers(http.headers, sum(len(k) + len(v) for k, v in http.headers.raw), anthropic)

    def check_headers(self, headers: Mapping[str, str], header_bytes: int, anthropic: bool = False) -> None:
        """`check_head` on headers however they came (HTTP, or an Envoy ext_proc message);
        `headers` answers lower-case names. On the Anthropic routes (`anthropic`) the key may
        come as Anthropic's clients send it, `x-api-key: <key>`, as well as a bearer token."""
        s = self.settings
        if self._api_key is not None:
            given = headers.get("authorization", "").encode()
            keyed = anthropic and hmac.compare_digest(headers.get("x-api-key", "").encode(), self._bare_key)
            if not (hmac.compare_digest(given, self._api_key) or keyed):
                raise GatewayError(
                    401, "Incorrect API key provided.", code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"}
                )
        if header_bytes > s.max_header_bytes:
            raise GatewayError(431, f"request headers of {header_bytes} bytes exceed the limit of {s.max_header_bytes}")
        declared = headers.get("content-length")
        if declared is not None:
            try:
                length = int(declared)
            except ValueError:
                raise bad_request(f"invalid Content-Length {declared[:40]!r}") from None
            if length > s.max_body_bytes:
                raise GatewayError(413, f"request body of {length} bytes exceeds the limit of {s.max_body_bytes}")

    async def read_body(self, http: Request) -> bytes:
        """The body, read within body_read_timeout_s (408) and never past max_body_bytes (413)."""
        s = self.settings
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(s.body_read_timeout_s):
                async for chunk in http.stream():
                    size += len(chunk)
                    if size > s.max_body_bytes:
                        raise GatewayError(
                            413, f"request body of over {size} bytes exceeds the limit of {s.max_body_bytes}"
                        )
                    chunks.append(chunk)
        except TimeoutError:
            raise GatewayError(408, f"request body not received within {s.body_read_timeout_s} s") from None
        except ClientDisconnect:
            raise bad_request("client disconnected while sending the body") from None
        return b"".join(chunks)

    def enter(self) -> None:
        """Count a request in, or shed it (503 + Retry-After) when the replica is full, rather than
        let it wait in Serve's queue behind requests that may never finish."""
        if self.in_flight >= self.settings.max_in_flight:
            raise GatewayError(
                503,
                f"the gateway is at its limit of {self.settings.max_in_flight} requests in flight; retry later",
                headers={"Retry-After": SHED_RETRY_AFTER_S},
            )
        self.in_flight += 1

    def leave(self) -> None:
        self.in_flight -= 1

    def let_in(self, http: Request) -> Response | None:
        """`check_head` and `enter` for a route that answers its own way: None when the request
        is in (the caller then `leave()`s), else the refusal's answer."""
        try:
            self.check_head(http)
            self.enter()
        except GatewayError as err:
            return err.response()
        return None
