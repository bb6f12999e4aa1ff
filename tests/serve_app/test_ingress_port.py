"""What `epp up` says when the gateway port is taken: a live listener is named by pid; a port held
only by TIME_WAIT connections of a listener that did not set SO_REUSEADDR is called that (it used
to read "by a process this user can not see")."""

from __future__ import annotations

import os
import socket
import time

import pytest

from serve_app.ingress import PortInUse, check_port_free, reuseport_socket


def time_wait_port() -> int:
    """A port whose only trace is a server-side connection in TIME_WAIT (the server closed first)
    of a listener bound without SO_REUSEADDR, as Serve's direct ingress binds."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = listener.accept()
    conn.close()  # the active close: this side goes to TIME_WAIT
    time.sleep(0.05)
    client.close()
    listener.close()
    return port


def test_a_port_held_only_by_time_wait_connections_says_so():
    port = time_wait_port()
    for bind in (check_port_free, reuseport_socket):
        with pytest.raises(PortInUse) as err:
            bind("127.0.0.1", port)
        message = str(err.value)
        assert "TIME_WAIT" in message and "SO_REUSEADDR" in message and "no process holds it" in message, message
        assert "can not see" not in message
        assert err.value.time_wait >= 1


def test_a_live_listener_is_named_by_its_pid():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with pytest.raises(PortInUse, match=f"pid {os.getpid()}"):
            check_port_free("127.0.0.1", port)


async def _hello(scope, receive, send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


async def _exchange(reader, writer) -> bytes:
    """One keep-alive GET on an open connection: the whole answer, or b"" if the server closed."""
    writer.write(b"GET / HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n") if not reader.at_eof() else b""
    return head + await reader.readexactly(2) if head else b""


@pytest.mark.parametrize(("keep_alive_s", "idle_s", "kept"), [(None, 5.5, True), (0.3, 1.0, False)])
def test_an_idle_connection_outlasts_the_clients_pools(keep_alive_s, idle_s, kept):
    """A connection idle past httpx's (the OpenAI SDK's) 5 s pool expiry still takes a request:
    the server waits longer than the client, so the client is the one that closes. The short
    keep-alive shows the test sees a server-side close."""
    import asyncio

    from serve_app.ingress import SharedPortServer
    from serve_app.settings import GatewaySettings

    async def run() -> tuple[bytes, bytes]:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        wait = keep_alive_s if keep_alive_s is not None else GatewaySettings().keep_alive_timeout_s
        server = SharedPortServer(_hello, "127.0.0.1", port, lambda: True, wait)
        await server.start()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            first = await _exchange(reader, writer)
            await asyncio.sleep(idle_s)
            try:
                second = await _exchange(reader, writer)
            except (ConnectionError, asyncio.IncompleteReadError):
                second = b""
            writer.close()
            return first, second
        finally:
            await server.stop()

    first, second = asyncio.run(run())
    assert first.startswith(b"HTTP/1.1 200") and first.endswith(b"ok")
    assert (second.startswith(b"HTTP/1.1 200") and second.endswith(b"ok")) is kept, second
