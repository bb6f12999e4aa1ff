"""The same-node channel to a profile actor: token, pipelining, errors, a dropped connection."""

from __future__ import annotations

import asyncio

import pytest

from actors import channel
from actors.channel import ChannelClient, ChannelServer, Unsendable


async def echo_times_ten(items):
    await asyncio.sleep(0.01 if items and items[0] == "slow" else 0)
    if items == ["boom"]:
        raise ValueError("plugin bug")
    return [x * 10 if isinstance(x, int) else x for x in items]


async def started(handler=echo_times_ten):
    server = ChannelServer(handler)
    await server.start()
    client = ChannelClient(server.port, server.token)
    await client.connect()
    return server, client


async def test_round_trip_and_pipelining_match_answers_to_requests():
    server, client = await started()
    try:
        answers = await asyncio.gather(client.request(["slow", 1]), client.request([2, 3]), client.request([4]))
        assert answers == [["slow", 10], [20, 30], [40]]
    finally:
        await client.close()
        await server.close()


async def test_handler_error_reaches_the_caller_and_the_connection_lives_on():
    server, client = await started()
    try:
        with pytest.raises(ValueError, match="plugin bug"):
            await client.request(["boom"])
        assert await client.request([5]) == [50]
    finally:
        await client.close()
        await server.close()


async def test_wrong_token_is_dropped():
    server = ChannelServer(echo_times_ten)
    await server.start()
    client = ChannelClient(server.port, b"x" * 16)
    await client.connect()
    try:
        with pytest.raises(ConnectionError):
            await asyncio.wait_for(client.request([1]), 5)
    finally:
        await client.close()
        await server.close()


async def test_an_unpicklable_payload_fails_alone_and_the_channel_stays_up():
    server, client = await started()
    deep: list = []
    for _ in range(5000):
        deep = [deep]
    try:
        with pytest.raises(Unsendable):
            await client.request([deep])
        assert not client.closed
        assert await client.request([6]) == [60]
    finally:
        await client.close()
        await server.close()


async def test_an_unpicklable_answer_fails_that_call_only():
    async def deep_answer(items):
        if items == ["deep"]:
            deep: list = []
            for _ in range(5000):
                deep = [deep]
            return [deep]
        return [x * 10 for x in items]

    server, client = await started(deep_answer)
    try:
        with pytest.raises(Unsendable):
            await asyncio.wait_for(client.request(["deep"]), 5)
        assert await client.request([7]) == [70]
    finally:
        await client.close()
        await server.close()


async def test_a_connection_that_never_presents_the_token_is_dropped(monkeypatch):
    monkeypatch.setattr(channel, "HANDSHAKE_TIMEOUT_S", 0.2)
    server = ChannelServer(echo_times_ten)
    await server.start()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(server.token[:3])  # part of it, then nothing
        assert await asyncio.wait_for(reader.read(), 3) == b""  # the server closed the connection
    finally:
        writer.close()
        await server.close()


async def test_server_going_away_fails_waiting_requests_with_connection_error():
    never = asyncio.Event()

    async def hang(items):
        await never.wait()

    server, client = await started(hang)
    pending = asyncio.ensure_future(client.request([1]))
    await asyncio.sleep(0.05)
    await server.close()
    # Closing the listening socket does not cut open connections; the client closes its side.
    client._writer.transport.abort()
    with pytest.raises(ConnectionError):
        await asyncio.wait_for(pending, 5)
    assert client.closed
    with pytest.raises(ConnectionError):
        await client.request([2])
