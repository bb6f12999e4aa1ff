"""Forward a request to a model server with one pooled aiohttp session; relay the answer as it
arrives (no buffering of SSE)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import aiohttp

from scheduler import Endpoint
from serve_app.gateway.endpoint_view import EndpointView
from serve_app.gateway.parsing import HOP_HEADERS
from serve_app.gateway.unhealthy_pods import PodLeft, UnhealthyPods

# Upstream answers worth retrying elsewhere, when nothing has reached the client yet.
RETRYABLE_STATUS = frozenset({503})


class UpstreamUnavailable(Exception):
    """The endpoint could not take the request (connection failed, or 503 before the first byte)."""


class Forwarder:
    """`first_byte_timeout_s` bounds the wait for a streaming request's response headers (a hung
    pod: the caller retries elsewhere); a non-streaming answer comes whole at the end, so only
    `total_timeout_s` bounds it. Given the replica's `view`, a request waiting at a pod that leaves it
    and that the datastore finds unhealthy is moved (serve_app/gateway/unhealthy_pods.py)."""

    def __init__(
        self,
        connect_timeout_s: float,
        total_timeout_s: float,
        first_byte_timeout_s: float | None = None,
        view: EndpointView | None = None,
    ) -> None:
        self._timeout = aiohttp.ClientTimeout(total=total_timeout_s, sock_connect=connect_timeout_s)
        self._first_byte_timeout_s = first_byte_timeout_s
        self._session: aiohttp.ClientSession | None = None
        self.unhealthy = None if view is None else UnhealthyPods.following(view)

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, keepalive_timeout=30)
            self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout, auto_decompress=False)
        return self._session

    async def open(
        self,
        endpoint: Endpoint,
        path: str,
        body: bytes,
        headers: dict[str, str],
        stream: bool = False,
        method: str = "POST",
    ) -> aiohttp.ClientResponse:
        """Send the request; the caller reads (or streams) and releases the response."""
        url = f"http://{endpoint.address}:{endpoint.port}{path}"
        wait = self._first_byte_timeout_s if stream else None
        until_first_byte = self.unhealthy.waiting(endpoint.name) if self.unhealthy else contextlib.nullcontext()
        try:
            with until_first_byte:
                async with asyncio.timeout(wait):
                    resp = await self.session().request(method, url, data=body or None, headers=headers)
        except PodLeft as err:
            raise UpstreamUnavailable(str(err)) from None
        except TimeoutError:
            what = f"no response within {wait} s" if wait is not None else "timed out"
            raise UpstreamUnavailable(f"{endpoint.name} ({endpoint.host_port}): {what}") from None
        except aiohttp.ClientConnectionError as err:
            raise UpstreamUnavailable(f"{endpoint.name} ({endpoint.host_port}): {type(err).__name__}: {err}") from None
        if resp.status in RETRYABLE_STATUS:
            resp.release()
            raise UpstreamUnavailable(f"{endpoint.name} ({endpoint.host_port}) answered {resp.status}")
        return resp

    async def post_json(self, endpoint: Endpoint, path: str, payload: dict, headers: dict[str, str]) -> dict:
        """A non-streaming call whose JSON answer the gateway itself needs (e.g. a prefill step)."""
        resp = await self.open(endpoint, path, json.dumps(payload).encode(), headers)
        async with resp:
            if resp.status != 200:
                raise UpstreamUnavailable(f"{endpoint.name} answered {resp.status}: {(await resp.text())[:200]}")
            return await resp.json(content_type=None)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


# The gateway's own server sets these; copying the upstream's would send them twice.
_OWN_HEADERS = HOP_HEADERS | {"date", "server"}


def response_headers(resp: aiohttp.ClientResponse) -> dict[str, str]:
    return {k: v for k, v in resp.headers.items() if k.lower() not in _OWN_HEADERS}


async def relay(
    resp: aiohttp.ClientResponse, is_sse: bool, idle_timeout_s: float | None = None
) -> AsyncIterator[bytes]:
    """Chunks as they arrive. A failure after the first byte, or `idle_timeout_s` without a
    chunk, ends an SSE stream with an error event rather than a torn (or held) connection; the
    upstream is released when the client goes away."""
    chunks = resp.content.iter_any().__aiter__()
    try:
        while True:
            deadline = asyncio.timeout(idle_timeout_s)
            try:
                async with deadline:
                    chunk = await chunks.__anext__()
            except StopAsyncIteration:
                return
            except TimeoutError:
                if deadline.expired():
                    raise TimeoutError(f"no data for {idle_timeout_s} s") from None
                raise
            yield chunk
    except (aiohttp.ClientError, TimeoutError) as err:
        if is_sse:
            event = {
                "error": {
                    "message": f"upstream failed mid-stream: {err}",
                    "type": "bad_gateway",
                    "param": None,
                    "code": "ServiceUnavailable",
                }
            }
            yield f"data: {json.dumps(event)}\n\ndata: [DONE]\n\n".encode()
    finally:
        resp.release()
