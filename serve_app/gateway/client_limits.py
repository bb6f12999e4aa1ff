"""Per-client shares of a gateway replica: what one client holds (connections, requests in flight,
bodies still being read) is counted under its own limit, so one client cannot take the replica's
whole capacity, while the replica's own limit (`max_in_flight`) still holds for all of them.

A client is the API key it presented (when `api_key` lists several keys, each a tenant), else its
fairness id (`x-gateway-inference-fairness-id`, only when `trust_fairness_id` says a proxy in front
sets it), else its source address. Connections are counted by source address alone: a connection
is counted before any request on it is read."""

from __future__ import annotations

import json
from http import HTTPStatus

from serve_app.gateway.errors import GatewayError

CLIENT_RETRY_AFTER_S = "1"
RATE_LIMIT_CODE = "rate_limit_exceeded"  # OpenAI's code for a 429 of the caller's own making
MAX_CLIENT_ID_CHARS = 128  # a fairness id longer than this is cut: it keys a dict entry


class ClientLedger:
    """How many of one thing each client holds, each client under `limit`. A client's entry goes
    when it holds nothing, so the ledger only holds clients with something open."""

    __slots__ = ("_held", "limit", "what")

    def __init__(self, what: str, limit: int) -> None:
        self.what = what
        self.limit = limit
        self._held: dict[str, int] = {}

    def take(self, client: str) -> None:
        """Count one more for `client`, or raise the 429 it gets over its share."""
        held = self._held.get(client, 0)
        if held >= self.limit:
            raise over_share(self.what, self.limit)
        self._held[client] = held + 1

    def give_back(self, client: str) -> None:
        held = self._held[client] - 1
        if held:
            self._held[client] = held
        else:
            del self._held[client]

    def held(self, client: str) -> int:
        return self._held.get(client, 0)

    def __len__(self) -> int:
        return len(self._held)


def over_share(what: str, limit: int) -> GatewayError:
    return GatewayError(
        429,
        f"this client already has {limit} {what} at this gateway replica, its limit; retry later",
        code=RATE_LIMIT_CODE,
        headers={"Retry-After": CLIENT_RETRY_AFTER_S},
    )


def refusal_bytes(err: GatewayError) -> bytes:
    """`err` as a whole HTTP/1.1 response that closes the connection, for a server that refuses a
    connection before it has read a request from it."""
    body = json.dumps(err.body(), separators=(",", ":")).encode()
    head = [f"HTTP/1.1 {err.status} {HTTPStatus(err.status).phrase}", "content-type: application/json"]
    head += [f"{k.lower()}: {v}" for k, v in (err.headers or {}).items()]
    head += [f"content-length: {len(body)}", "connection: close"]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body
