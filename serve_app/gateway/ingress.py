"""The gateway's address: every gateway replica of a node serves HTTP on the same port.

Each replica opens its own listening socket with SO_REUSEADDR + SO_REUSEPORT on the gateway port and
runs uvicorn on it with the gateway's FastAPI app. The kernel spreads new connections over the
sockets of the group; a dead replica's socket leaves the group, so new connections go to the
survivors at once, and the replica Serve starts in its place joins again. SO_REUSEADDR lets a
restarted gateway bind while the last run's connections still sit in TIME_WAIT, so it keeps its
port. Serve's own direct ingress (one port per replica, bound without SO_REUSEADDR) has neither.

SO_REUSEPORT lets any socket of the same user join the group, so the group has an owner: a second
gateway on the same port (another `epp up` started before the first one's replicas listened, so
both passed the launcher's free-port check; a benchmark on the same default port) would otherwise
join it, the kernel splitting clients between two unrelated deployments, and its stop resetting
the connections queued on its socket. A replica binds and listens only while holding an exclusive
lock on a per-port file naming the owning deployment (`owned_port`): it may join when nothing
listens yet (and records its deployment) or when the file names its own deployment (a sibling, a
replica restarted in its place, a redeploy of the same application). The file is per machine,
the scope of a port: one deployment's replicas on several Ray nodes of one machine share it."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import socket
import tempfile
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import psutil

from serve_app.gateway.client_limits import ClientLedger, refusal_bytes
from serve_app.gateway.errors import GatewayError

STARTUP_TIMEOUT_S = 30.0
REFUSED_LINGER_S = 1.0  # a connection refused over its client's share is closed this long after its answer


def reuseport_socket(host: str, port: int) -> socket.socket:
    """A bound (not yet listening) socket that joins the port's SO_REUSEPORT group on listen().
    Linux only lets sockets of the same user share the port, and only if every one of them set
    SO_REUSEPORT: a port held by anything else still fails with EADDRINUSE."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        if err.errno == errno.EADDRINUSE:
            raise PortInUse(host, port) from None
        raise
    sock.setblocking(False)
    return sock


class PortInUse(OSError):
    """The gateway port is held by a process that is not a gateway replica of this deployment."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        held = port_holders(port)
        self.time_wait = 0 if held else time_wait_connections(port)
        if held:
            by = f" by {', '.join(held)}"
        elif self.time_wait:
            # Such sockets keep the listener's SO_REUSEADDR setting: one bound without it (Serve's
            # direct ingress, most servers' defaults) leaves connections that block every bind.
            by = (
                f": no process holds it, but {self.time_wait} closed connection(s) of an earlier listener that did "
                "not set SO_REUSEADDR are in TIME_WAIT; the kernel frees the port within 60 s"
            )
        else:
            by = " (by a process this user can not see)"
        super().__init__(errno.EADDRINUSE, f"port {port} on {host} is in use{by}")


def port_holders(port: int) -> list[str]:
    """Who listens on a TCP port, as 'pid N (name: cmdline)', for error messages."""
    out: list[str] = []
    with contextlib.suppress(psutil.Error, OSError):
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status != psutil.CONN_LISTEN or not conn.laddr or conn.laddr.port != port:
                continue
            if conn.pid is None:
                out.append(f"a socket on {conn.laddr.ip}:{port} of an unknown process")
                continue
            try:
                proc = psutil.Process(conn.pid)
                cmd = " ".join(" ".join(proc.cmdline()).split())[:100]  # Ray pads its titles with spaces
                name = proc.name()
                out.append(f"pid {conn.pid} ({cmd if cmd.startswith(name) else f'{name}: {cmd}'})")
            except psutil.Error:
                out.append(f"pid {conn.pid}")
    return sorted(set(out))


def time_wait_connections(port: int) -> int:
    """How many TCP connections with local port `port` are in TIME_WAIT (they have no process)."""
    with contextlib.suppress(psutil.Error, OSError):
        return sum(
            1
            for conn in psutil.net_connections(kind="tcp")
            if conn.status == psutil.CONN_TIME_WAIT and conn.laddr and conn.laddr.port == port
        )
    return 0


def check_port_free(host: str, port: int) -> None:
    """Raise PortInUse when something listens on host:port, even a gateway replica of another run
    (which would otherwise share the port with ours)."""
    if someone_listens(host, port):
        raise PortInUse(host, port)


def someone_listens(host: str, port: int) -> bool:
    """Whether a socket listens on host:port: a bind with SO_REUSEADDR but not SO_REUSEPORT fails
    on any listener, and a connection in TIME_WAIT does not count."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                return True
            raise
    return False


class PortOwnedElsewhere(PortInUse):
    """The port's group belongs to another Ray EPP deployment."""

    def __init__(self, host: str, port: int, owner: str) -> None:
        super().__init__(host, port)
        self.owner = owner
        self.strerror = f"{self.strerror}; its gateway port group was claimed by {owner}"


def port_owners_dir() -> Path:
    return Path(tempfile.gettempdir()) / f"ray-epp-ports-{os.getuid()}"


@contextlib.contextmanager
def owned_port(host: str, port: int, owner: str) -> Iterator[None]:
    """Hold the port's lock while the caller binds and listens. Raise PortOwnedElsewhere, or
    PortInUse for a listener no deployment recorded, when the group is not `owner`'s."""
    directory = port_owners_dir()
    directory.mkdir(mode=0o700, exist_ok=True)
    with open(directory / f"{port}.owner", "a+", encoding="utf-8") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            f.seek(0)
            recorded = f.read().strip()
            if recorded != owner:
                if someone_listens(host, port):
                    if recorded:
                        raise PortOwnedElsewhere(host, port, recorded)
                    raise PortInUse(host, port)
                f.seek(0)
                f.truncate()
                f.write(owner + "\n")
                f.flush()
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def connections_per_client(connections: ClientLedger) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol, counting each connection in `connections` under its source address.
    One past the address's limit is answered 429 + Retry-After before a request on it is read, and
    closed: at once for writing (the answer, then FIN), `REFUSED_LINGER_S` later whole, what the
    client sends meanwhile dropped (closing at once over unread bytes would reset the connection,
    and the client could lose the answer)."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    class PerClientConnections(AutoHTTPProtocol):  # type: ignore[misc, valid-type]
        _counted: str | None = None
        _refused = False

        def connection_made(self, transport: Any) -> None:
            peer = transport.get_extra_info("peername")
            address = peer[0] if isinstance(peer, tuple) and peer else None
            if address is not None:
                try:
                    connections.take(address)
                except GatewayError as err:  # the address holds its share
                    self._refused = True
                    transport.write(refusal_bytes(err))
                    transport.write_eof()
                    asyncio.get_running_loop().call_later(REFUSED_LINGER_S, transport.close)
                    return
                self._counted = address
            super().connection_made(transport)

        def data_received(self, data: bytes) -> None:
            if not self._refused:
                super().data_received(data)

        def eof_received(self) -> Any:
            if not self._refused:
                return super().eof_received()
            return None

        def connection_lost(self, exc: Exception | None) -> None:
            if self._refused:
                return
            if self._counted is not None:
                connections.give_back(self._counted)
                self._counted = None
            super().connection_lost(exc)

    return PerClientConnections


class _Server:
    """uvicorn's Server without its signal handlers: the replica's process owns its signals."""

    @staticmethod
    def make(app: Any, host: str, port: int, keep_alive_s: float, http: type[asyncio.Protocol] | str = "auto") -> Any:
        import uvicorn

        class Server(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self) -> Generator[None, None, None]:
                yield

            def install_signal_handlers(self) -> None:  # uvicorn < 0.29's name for the same
                pass

        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            lifespan="off",
            access_log=False,
            log_config=None,
            timeout_graceful_shutdown=5,
            timeout_keep_alive=keep_alive_s,
            http=http,
        )
        return Server(config)


class SharedPortServer:
    """One replica's HTTP server on the shared port, in the group of `owner` (its deployment's
    name, the same for all its replicas; see `owned_port`). Requests that arrive before `ready()`
    (Serve sets the replica context a moment after the constructor returns) wait for it."""

    def __init__(
        self,
        app: Any,
        host: str,
        port: int,
        ready: Callable[[], bool],
        keep_alive_s: float,
        owner: str,
        client_max_connections: int | None = None,
    ) -> None:
        self._app = app
        # connections held per source address (None: no per-client limit)
        self.connections = ClientLedger("connections", client_max_connections) if client_max_connections else None
        self.owner = owner
        self._keep_alive_s = keep_alive_s
        self._ready = ready
        self._is_ready = False
        self.host, self.port = host, port
        self._server: Any = None
        self._task: asyncio.Task | None = None

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if not self._is_ready:
            while not self._ready():
                await asyncio.sleep(0.01)
            self._is_ready = True
        await self._app(scope, receive, send)

    async def start(self) -> None:
        """Bind, listen, and return once the socket is in the port's group."""
        http = connections_per_client(self.connections) if self.connections is not None else "auto"
        self._server = _Server.make(self, self.host, self.port, self._keep_alive_s, http)
        with owned_port(self.host, self.port, self.owner):
            sock = reuseport_socket(self.host, self.port)
            try:
                sock.listen(self._server.config.backlog)  # in the group before the lock is let go
            except OSError:
                sock.close()
                raise
        self._task = asyncio.get_running_loop().create_task(self._server.serve(sockets=[sock]))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STARTUP_TIMEOUT_S
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises what stopped it
                raise RuntimeError(f"the gateway's HTTP server on {self.host}:{self.port} stopped at startup")
            if loop.time() > deadline:
                raise RuntimeError(f"the gateway's HTTP server on {self.host}:{self.port} did not start")
            await asyncio.sleep(0.005)

    @property
    def serving(self) -> bool:
        return self._task is not None and not self._task.done() and bool(self._server.started)

    async def stop(self) -> None:
        """Leave the port's group first (new connections go to the other replicas), then let the
        requests in flight finish (bounded by uvicorn's graceful timeout)."""
        if self._server is None or self._task is None:
            return
        for server in getattr(self._server, "servers", []):
            server.close()
        self._server.should_exit = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.shield(self._task), 10)
