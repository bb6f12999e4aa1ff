"""A direct, same-node channel from a gateway replica to a profile actor.

A Ray actor call made from a Serve replica costs 4-6 ms on this 2-core machine (1-2 ms from a
plain driver), which would be most of the gateway's added latency. The profile actor therefore
also listens on 127.0.0.1; a gateway replica on the same node sends its batches there as
length-prefixed pickles over one persistent connection (pipelined, answered by message id). Ray
still owns the actor's life (placement, restarts) and the discovery: `channel_endpoint()` is an
ordinary actor call that returns the port and a per-actor random token, which the client must
present first (within HANDSHAKE_TIMEOUT_S, else the connection is dropped), so no other local
process can feed pickles to the actor or hold its connections. Anything unexpected (actor
restarted, other node, connection lost) and the caller falls back to the Ray call. A payload that
can not be pickled fails that request alone (`Unsendable`); the connection stays up."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import pickle
import secrets
import struct
from collections.abc import Awaitable, Callable
from typing import Any

_HEADER = struct.Struct("!I")
MAX_FRAME = 256 * 1024 * 1024
HANDSHAKE_TIMEOUT_S = 5.0


class Unsendable(ValueError):
    """The payload could not be pickled: nothing was sent, the channel is intact."""


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    (n,) = _HEADER.unpack(await reader.readexactly(_HEADER.size))
    if n > MAX_FRAME:
        raise ConnectionError(f"frame of {n} bytes is over the limit")
    return await reader.readexactly(n)


def _frame(obj: Any) -> bytes:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(data)) + data


class ChannelServer:
    """Serves `handler(items)` to clients that present the token. Loopback only."""

    def __init__(self, handler: Callable[[Any], Awaitable[Any]]) -> None:
        self._handler = handler
        self.token = secrets.token_bytes(16)
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
                presented = await reader.readexactly(len(self.token))
            if not hmac.compare_digest(presented, self.token):
                return
            while True:
                msg_id, payload = pickle.loads(await _read_frame(reader))
                try:
                    answer = (msg_id, True, await self._handler(payload))
                except Exception as err:  # the caller gets the error, the connection lives on
                    answer = (msg_id, False, err)
                try:
                    frame = _frame(answer)
                except Exception as err:  # e.g. an answer nested too deep to pickle: that call fails
                    frame = _frame((msg_id, False, Unsendable(f"answer could not be pickled: {err!r}"[:500])))
                writer.write(frame)
        except (asyncio.IncompleteReadError, ConnectionError, OSError, TimeoutError):
            pass
        finally:
            writer.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()


class ChannelClient:
    """One connection; concurrent requests are pipelined and matched by message id."""

    def __init__(self, port: int, token: bytes) -> None:
        self.port, self.token = port, token
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task | None = None
        self._waiting: dict[int, asyncio.Future] = {}
        self._ids = itertools.count()
        self.closed = False

    async def connect(self) -> None:
        reader, self._writer = await asyncio.open_connection("127.0.0.1", self.port)
        self._writer.write(self.token)
        self._reader_task = asyncio.get_running_loop().create_task(self._read(reader))

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                msg_id, ok, value = pickle.loads(await _read_frame(reader))
                fut = self._waiting.pop(msg_id, None)
                if fut is not None and not fut.done():
                    if ok:
                        fut.set_result(value)
                    else:
                        fut.set_exception(value)
        except (asyncio.IncompleteReadError, ConnectionError, OSError) as err:
            self._fail(ConnectionError(f"profile actor channel closed: {err}"))
        except asyncio.CancelledError:
            self._fail(ConnectionError("profile actor channel closed"))
            raise

    def _fail(self, err: Exception) -> None:
        self.closed = True
        for fut in self._waiting.values():
            if not fut.done():
                fut.set_exception(err)
        self._waiting.clear()

    async def request(self, payload: Any) -> Any:
        if self.closed or self._writer is None:
            raise ConnectionError("profile actor channel is closed")
        msg_id = next(self._ids)
        try:
            frame = _frame((msg_id, payload))
        except Exception as err:  # RecursionError, PicklingError, TypeError: this payload's fault
            raise Unsendable(f"request could not be pickled: {err!r}"[:500]) from None
        fut = asyncio.get_running_loop().create_future()
        self._waiting[msg_id] = fut
        self._writer.write(frame)
        return await fut

    async def close(self) -> None:
        self.closed = True
        if self._reader_task is not None:
            self._reader_task.cancel()
        if self._writer is not None:
            self._writer.close()
