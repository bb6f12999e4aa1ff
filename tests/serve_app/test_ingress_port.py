"""What `epp up` says when the gateway port is taken: a live listener is named by pid; a port held
only by TIME_WAIT connections of a listener that did not set SO_REUSEADDR is called that (it used
to read "by a process this user can not see"). Who may join the port's SO_REUSEPORT group: the
replicas of the deployment that claimed it, never another deployment, even one starting at the
same moment. Idle connections outlast the clients' pools."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from serve_app.gateway.ingress import (
    PortInUse,
    PortOwnedElsewhere,
    SharedPortServer,
    check_port_free,
    port_owners_dir,
    reuseport_socket,
)

ROOT = Path(__file__).resolve().parents[2]


def port_listeners(port: int) -> list[int]:
    return [
        c.pid
        for c in psutil.net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
    ]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


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


def _server(port: int, owner: str) -> SharedPortServer:
    return SharedPortServer(_hello, "127.0.0.1", port, lambda: True, 5.0, owner)


async def _get(port: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        return await _exchange(reader, writer)
    finally:
        writer.close()


def test_the_port_group_takes_its_owners_replicas_and_refuses_another_deployment():
    """A sibling replica of the owner joins; another deployment is refused with both names and the
    owner keeps serving alone; once the owner's replicas are gone the other may claim the port."""

    async def run() -> None:
        port = free_port()
        first, sibling = _server(port, "cluster A, epp/Gateway"), _server(port, "cluster A, epp/Gateway")
        await first.start()
        await sibling.start()
        assert len(port_listeners(port)) == 2
        other = _server(port, "cluster B, epp/Gateway")
        with pytest.raises(PortOwnedElsewhere) as err:
            await other.start()
        assert f"port {port} on 127.0.0.1 is in use by pid {os.getpid()}" in str(err.value)
        assert "claimed by cluster A, epp/Gateway" in str(err.value)
        assert not other.serving and len(port_listeners(port)) == 2
        assert (await _get(port)).endswith(b"ok")
        await first.stop()
        await sibling.stop()
        await other.start()  # the stale claim is replaced
        try:
            assert other.serving and (await _get(port)).endswith(b"ok")
        finally:
            await other.stop()

    asyncio.run(run())


def test_a_reuseport_listener_no_deployment_claimed_is_not_joined():
    """Another program of ours on the port with SO_REUSEPORT (the kernel would let us share it)."""

    async def run() -> None:
        port = free_port()
        (port_owners_dir() / f"{port}.owner").unlink(missing_ok=True)  # a claim left by an earlier run
        holder = reuseport_socket("127.0.0.1", port)
        holder.listen()
        try:
            with pytest.raises(PortInUse, match=f"pid {os.getpid()}"):
                await _server(port, "cluster A, epp/Gateway").start()
        finally:
            holder.close()

    asyncio.run(run())


RACER = """
import asyncio, sys, time
from serve_app.gateway.ingress import PortInUse, SharedPortServer
async def hello(scope, receive, send):
    pass
async def main(port, owner, at):
    time.sleep(max(0.0, at - time.time()))
    server = SharedPortServer(hello, "127.0.0.1", port, lambda: True, 5.0, owner)
    try:
        await server.start()
    except PortInUse as err:
        print("refused", err, flush=True)
        return
    print("serving", flush=True)
    await asyncio.to_thread(sys.stdin.read)  # until every racer has tried: the test closes our stdin
    await server.stop()
asyncio.run(main(int(sys.argv[1]), sys.argv[2], float(sys.argv[3])))
"""


def test_deployments_starting_at_the_same_moment_get_one_owner():
    """Four gateways of four deployments start on one port at the same instant (as two `epp up`s
    whose free-port checks both passed): one serves, three are refused, none shares the port."""
    port, at = free_port(), time.time() + 1.5
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, str(port), f"deployment {i}", str(at)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    pool = ThreadPoolExecutor(len(racers))
    try:  # each racer says one line once it has tried
        said = [line.strip() for line in pool.map(lambda r: r.stdout.readline(), racers, timeout=60)]
        for r in racers:
            r.stdin.close()  # every racer has tried: the one serving may stop
            r.wait(60)
    finally:
        for r in racers:
            r.kill()
        pool.shutdown(wait=False)
    assert sorted(s.split()[0] for s in said) == ["refused", "refused", "refused", "serving"], said
    assert all("claimed by deployment" in s for s in said if s.startswith("refused")), said


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
    from serve_app.gateway.settings import GatewaySettings

    async def run() -> tuple[bytes, bytes]:
        port = free_port()
        wait = keep_alive_s if keep_alive_s is not None else GatewaySettings().keep_alive_timeout_s
        server = SharedPortServer(_hello, "127.0.0.1", port, lambda: True, wait, "test")
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
