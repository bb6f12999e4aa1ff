"""What a request must pass at a gateway replica's door, before it is parsed or scheduled: the API
key, the size of its headers and body, the time its body may take, its client's share and the
replica's limit of requests in flight, and whether its caller may see the decision trace."""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Mapping

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from scheduler.flowcontrol.types import FAIRNESS_ID_HEADER
from serve_app.gateway.api_views import ANTHROPIC_PATHS
from serve_app.gateway.client_limits import MAX_CLIENT_ID_CHARS, ClientLedger
from serve_app.gateway.errors import GatewayError, bad_request
from serve_app.gateway.settings import GatewaySettings

SHED_RETRY_AFTER_S = "1"


class Admission:
    """A request counted in at the door; `leave()` counts it out, once, whichever path ends it."""

    __slots__ = ("_intake", "client")

    def __init__(self, intake: RequestIntake, client: str | None) -> None:
        self._intake: RequestIntake | None = intake
        self.client = client

    def leave(self) -> None:
        intake, self._intake = self._intake, None
        if intake is not None:
            intake.in_flight -= 1
            if self.client is not None:
                intake.client_requests.give_back(self.client)


class RequestIntake:
    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings
        self.in_flight = 0  # requests of the OpenAI routes and /v1/pick this replica is serving
        self.client_requests = ClientLedger("requests in flight", settings.client_max_in_flight)
        self.client_bodies = ClientLedger("request bodies being sent", settings.client_max_unfinished_bodies)
        self._debug_token = settings.debug_token.encode() if settings.debug_token else None
        keys = [settings.api_key] if isinstance(settings.api_key, str) else settings.api_key or []
        self._api_keys = [key.encode() for key in keys]

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
        if self._api_keys and self._key_index(headers, anthropic) is None:
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

    def _key_index(self, headers: Mapping[str, str], anthropic: bool = True) -> int | None:
        """Which of the API keys the request presents, as a bearer token or (`anthropic`) as
        `x-api-key`; each compared in constant time."""
        bearer = headers.get("authorization", "").encode()
        bare = headers.get("x-api-key", "").encode() if anthropic else b""
        found = None
        for i, key in enumerate(self._api_keys):
            if hmac.compare_digest(bearer, b"Bearer " + key) or (anthropic and hmac.compare_digest(bare, key)):
                found = i
        return found

    def client_of(self, headers: Mapping[str, str], peer: str | None) -> str | None:
        """Who is asking, for the per-client limits: the API key it presented when several are
        configured, else its fairness id when `trust_fairness_id`, else its source address (None
        when there is none, as on the ext_proc door: then only the replica's limit applies)."""
        if len(self._api_keys) > 1:
            index = self._key_index(headers)
            if index is not None:
                return f"key:{index}"
        if self.settings.trust_fairness_id and (fairness := headers.get(FAIRNESS_ID_HEADER)):
            return f"fairness:{fairness[:MAX_CLIENT_ID_CHARS]}"
        return f"address:{peer}" if peer else None

    def client_of_http(self, http: Request) -> str | None:
        return self.client_of(http.headers, http.client.host if http.client else None)

    async def read_body(self, http: Request, client: str | None = None) -> bytes:
        """The body, read within body_read_timeout_s (408) and never past max_body_bytes (413),
        while counted in its client's share of unfinished bodies (429 over it)."""
        if client is None:
            return await self._read_body(http)
        self.client_bodies.take(client)
        try:
            return await self._read_body(http)
        finally:
            self.client_bodies.give_back(client)

    async def _read_body(self, http: Request) -> bytes:
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

    def enter(self, client: str | None = None) -> Admission:
        """Count a request in, or refuse it: 429 + Retry-After when its client holds its share of
        requests in flight, 503 + Retry-After when the replica is full, rather than let it wait in
        Serve's queue behind requests that may never finish."""
        if client is not None:
            self.client_requests.take(client)
        if self.in_flight >= self.settings.max_in_flight:
            if client is not None:
                self.client_requests.give_back(client)
            raise GatewayError(
                503,
                f"the gateway is at its limit of {self.settings.max_in_flight} requests in flight; retry later",
                headers={"Retry-After": SHED_RETRY_AFTER_S},
            )
        self.in_flight += 1
        return Admission(self, client)

    def let_in(self, http: Request) -> Admission | Response:
        """`check_head` and `enter` for a route that answers its own way: the Admission when the
        request is in (the caller then `leave()`s it), else the refusal's answer."""
        try:
            self.check_head(http)
            return self.enter(self.client_of_http(http))
        except GatewayError as err:
            return err.response()
