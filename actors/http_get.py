"""A small keep-alive HTTP/1.1 GET client for the scrape loop.

A metrics actor GETs the same URL 20 times a second; aiohttp spends ~1.1 ms of CPU per such scrape
of a 45 KB vLLM page (parse included) where this plain asyncio-streams client spends ~0.6 ms (see
docs/BENCHMARKS.md, "What do metrics, tracing and the decision record cost?"). It speaks only what
a scrape needs: GET over one persistent connection, bodies by Content-Length, chunked, or until
close; no TLS, proxies, redirects or compression (it asks for `identity`). Anything else is an
error that names the problem."""

from __future__ import annotations

import asyncio
import contextlib

MAX_HEADER_BYTES = 64 * 1024
# A vLLM page is ~45 KB (a few MB with hundreds of LoRA adapters); a pod that sends more is broken
# or hostile, and would cost the metrics actor memory and parse time 20 times a second.
MAX_BODY_BYTES = 16 * 1024 * 1024


class HttpError(Exception):
    """The request failed: connection, timeout, or a response this client does not accept."""


class KeepAliveGet:
    """GET paths on one host:port over a reused connection; reconnects after any failure."""

    def __init__(self, host: str, port: int, timeout_s: float, max_body_bytes: int = MAX_BODY_BYTES) -> None:
        self.host = host.strip("[]")
        self.port = port
        self.timeout_s = timeout_s
        self.max_body_bytes = max_body_bytes
        self._host_header = f"[{self.host}]:{port}" if ":" in self.host else f"{self.host}:{port}"
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def get(self, path: str) -> tuple[int, bytes]:
        """(status, body); raises HttpError. The whole exchange is bounded by timeout_s."""
        try:
            # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancel that races with
            # completion, and then stop() waits for a loop that never ends
            async with asyncio.timeout(self.timeout_s):
                return await self._get(path)
        except TimeoutError:
            await self.close()
            raise HttpError(f"timed out after {self.timeout_s:g}s") from None
        except HttpError:
            await self.close()
            raise
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as err:
            await self.close()
            raise HttpError(f"{type(err).__name__}: {err}") from None

    async def _get(self, path: str) -> tuple[int, bytes]:
        fresh = self._writer is None
        if fresh:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port, limit=MAX_HEADER_BYTES)
        request = (
            f"GET {path} HTTP/1.1\r\nHost: {self._host_header}\r\nAccept-Encoding: identity\r\n"
            "User-Agent: ray-epp\r\n\r\n"
        ).encode()
        assert self._reader is not None and self._writer is not None
        try:
            self._writer.write(request)
            head = await self._reader.readuntil(b"\r\n\r\n")
        except (OSError, asyncio.IncompleteReadError):
            if fresh:
                raise
            # the server closed an idle kept-alive connection: one retry on a new one
            await self.close()
            return await self._get(path)
        status, headers = _parse_head(head)
        body = await self._read_body(headers)
        if headers.get("connection", "").lower() == "close":
            await self.close()
        return status, body

    async def _read_body(self, headers: dict[str, str]) -> bytes:
        reader = self._reader
        assert reader is not None
        if headers.get("content-encoding", "identity").lower() != "identity":
            raise HttpError(f"unsupported Content-Encoding {headers['content-encoding']!r}")
        encoding = headers.get("transfer-encoding", "").lower()
        limit = self.max_body_bytes
        if encoding == "chunked":
            parts = []
            size_total = 0
            while True:
                line = await reader.readuntil(b"\r\n")
                size = int(line.split(b";", 1)[0].strip(), 16)
                if size == 0:
                    while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers
                        pass
                    return b"".join(parts)
                size_total += size
                if size_total > limit:
                    raise HttpError(too_large(limit))
                parts.append(await reader.readexactly(size))
                await reader.readexactly(2)
        if encoding not in ("", "identity"):
            raise HttpError(f"unsupported Transfer-Encoding {encoding!r}")
        length = headers.get("content-length")
        if length is not None:
            n = int(length)
            if n > limit:
                raise HttpError(too_large(limit))
            return await reader.readexactly(n)
        body = bytearray()  # delimited by close
        while chunk := await reader.read(min(limit + 1 - len(body), 1 << 20)):
            body += chunk
            if len(body) > limit:
                raise HttpError(too_large(limit))
        await self.close()
        return bytes(body)

    async def close(self) -> None:
        writer, self._reader, self._writer = self._writer, None, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


def too_large(limit: int) -> str:
    return f"response body larger than {limit} bytes"


def _parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise HttpError(f"not an HTTP/1.x response: {lines[0][:60]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers
