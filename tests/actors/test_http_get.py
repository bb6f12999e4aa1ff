"""The scrape loop's keep-alive GET client against raw asyncio servers on 127.0.0.1."""

from __future__ import annotations

import asyncio

import pytest

from actors.http_get import HttpError, KeepAliveGet


async def serve(responses):
    """A server that answers each request with the next raw response (bytes, or a callable on the
    writer); returns (server, port, connection count)."""
    it = iter(responses)
    connections = [0]

    async def handle(reader, writer):
        connections[0] += 1
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                resp = next(it)
                if resp is None:
                    writer.close()
                    return
                if callable(resp):
                    await resp(writer)
                else:
                    writer.write(resp)
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, StopIteration):
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], connections


def ok(body: bytes, extra: str = "") -> bytes:
    return f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


async def test_keep_alive_content_length_and_chunked():
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6;x=y\r\n world\r\n0\r\nT: 1\r\n\r\n"
    server, port, conns = await serve([ok(b"one"), chunked, ok(b"three", "Connection: close\r\n"), ok(b"four")])
    async with server:
        client = KeepAliveGet("127.0.0.1", port, 2.0)
        assert await client.get("/metrics") == (200, b"one")
        assert await client.get("/metrics") == (200, b"hello world")
        assert await client.get("/metrics") == (200, b"three")  # then the client closes
        assert await client.get("/metrics") == (200, b"four")
        assert conns[0] == 2
        await client.close()


async def test_reconnects_when_the_server_dropped_an_idle_connection():
    server, port, conns = await serve([ok(b"a"), None, ok(b"b")])
    async with server:
        client = KeepAliveGet("127.0.0.1", port, 2.0)
        assert await client.get("/m") == (200, b"a")
        assert await client.get("/m") == (200, b"b")  # the first try met a closed connection
        assert conns[0] == 2
        await client.close()


async def test_errors_are_http_errors():
    async def stall(writer):
        await asyncio.sleep(5)

    server, port, _ = await serve([b"SSH-2.0-OpenSSH\r\n\r\n", stall, ok(b"x", "Content-Encoding: gzip\r\n")])
    async with server:
        client = KeepAliveGet("127.0.0.1", port, 0.3)
        with pytest.raises(HttpError, match=r"not an HTTP/1\.x response"):
            await client.get("/m")
        with pytest.raises(HttpError, match=r"timed out after 0\.3s"):
            await client.get("/m")
        with pytest.raises(HttpError, match="unsupported Content-Encoding"):
            await client.get("/m")
    with pytest.raises(HttpError, match="ConnectionRefusedError"):
        await KeepAliveGet("127.0.0.1", 9, 1.0).get("/m")


async def test_status_and_body_of_an_error_page():
    server, port, _ = await serve([b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\n\r\nbusy"])
    async with server:
        client = KeepAliveGet("127.0.0.1", port, 1.0)
        assert await client.get("/metrics") == (503, b"busy")
        await client.close()


async def test_a_huge_or_endless_page_is_refused_at_the_cap_not_read_whole():
    """Content-Length, chunked and close-delimited bodies over the cap: an HttpError at the cap,
    long before the timeout (a close-delimited body used to be read whole, however large)."""

    async def endless(writer):  # close-delimited, never ends
        writer.write(b"HTTP/1.1 200 OK\r\n\r\n")
        while True:
            writer.write(b"# HELP x y\n" * 1000)
            await writer.drain()

    async def endless_chunks(writer):
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        while True:
            writer.write(b"2710\r\n" + b"x" * 10_000 + b"\r\n")
            await writer.drain()

    declared = b"HTTP/1.1 200 OK\r\nContent-Length: 999999999999\r\n\r\n"
    server, port, _ = await serve([endless, endless_chunks, declared])
    async with server:
        client = KeepAliveGet("127.0.0.1", port, 30.0, max_body_bytes=1_000_000)
        for _ in range(3):
            started = asyncio.get_running_loop().time()
            with pytest.raises(HttpError, match="larger than 1000000 bytes"):
                await client.get("/metrics")
            assert asyncio.get_running_loop().time() - started < 10, "refused at the cap, not at the timeout"
        await client.close()


async def test_a_slow_drip_page_is_cut_at_the_timeout():
    async def drip(writer):
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
        for _ in range(100):
            writer.write(b"x")
            await writer.drain()
            await asyncio.sleep(0.1)

    server, port, _ = await serve([drip])
    async with server:
        client = KeepAliveGet("127.0.0.1", port, 0.5)
        started = asyncio.get_running_loop().time()
        with pytest.raises(HttpError, match=r"timed out after 0\.5s"):
            await client.get("/metrics")
        assert asyncio.get_running_loop().time() - started < 5
