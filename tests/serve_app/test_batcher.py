"""ActorBatcher: coalescing, order, notifications and failures, with a fake actor method."""

from __future__ import annotations

import asyncio

import pytest

from serve_app.batcher import ActorBatcher


class FakeActor:
    """Records each batch; answers item * 10 after `delay` (None for notifications)."""

    def __init__(self, delay: float = 0.01, fail_on: str | None = None) -> None:
        self.batches: list[list] = []
        self.delay = delay
        self.fail_on = fail_on

    async def send(self, items: list) -> list:
        self.batches.append(list(items))
        await asyncio.sleep(self.delay)
        if self.fail_on is not None and self.fail_on in items:
            raise RuntimeError("actor died")
        return [None if isinstance(i, str) else i * 10 for i in items]


async def test_idle_call_goes_out_alone_and_at_once():
    actor = FakeActor()
    batcher = ActorBatcher(actor.send)
    assert await batcher.call(1) == 10
    assert actor.batches == [[1]]


async def test_concurrent_calls_coalesce_beyond_max_in_flight():
    actor = FakeActor(delay=0.02)
    batcher = ActorBatcher(actor.send, max_in_flight=2)
    results = await asyncio.gather(*(batcher.call(i) for i in range(10)))
    assert results == [i * 10 for i in range(10)]
    assert len(actor.batches) < 10
    assert sorted(x for b in actor.batches for x in b) == list(range(10))
    assert max(len(b) for b in actor.batches) >= 4


async def test_notifications_ride_with_the_next_call_in_order():
    actor = FakeActor()
    batcher = ActorBatcher(actor.send, notify_delay_s=1.0)
    batcher.notify("decision-1")
    batcher.notify("complete-1")
    assert await batcher.call(2) == 20
    assert actor.batches == [["decision-1", "complete-1", 2]]


async def test_lone_notifications_leave_after_the_delay():
    actor = FakeActor()
    batcher = ActorBatcher(actor.send, notify_delay_s=0.01)
    batcher.notify("decision")
    await asyncio.sleep(0.05)
    assert actor.batches == [["decision"]]


async def test_a_failed_batch_fails_its_calls_only():
    """An actor-level failure (split_on says no): the batch fails, the next call goes through."""
    actor = FakeActor(delay=0.01, fail_on="poison")
    batcher = ActorBatcher(actor.send, max_in_flight=1, notify_delay_s=1.0, split_on=lambda err: False)
    batcher.notify("poison")
    with pytest.raises(RuntimeError, match="actor died"):
        await batcher.call(1)
    assert await batcher.call(2) == 20


async def test_one_bad_item_fails_alone_and_its_batch_mates_are_served():
    """A batch that fails is sent again item by item, in order: only the bad item's caller fails."""
    actor = FakeActor(delay=0.01, fail_on="poison")
    batcher = ActorBatcher(actor.send, max_in_flight=1, notify_delay_s=1.0)
    blocker = asyncio.ensure_future(batcher.call(0))  # in flight: the next ones coalesce
    await asyncio.sleep(0)
    batcher.notify("decision")
    calls = [asyncio.ensure_future(batcher.call(x)) for x in (1, "poison", 3)]
    results = await asyncio.gather(blocker, *calls, return_exceptions=True)
    assert results[0] == 0 and results[1] == 10 and results[3] == 30
    assert isinstance(results[2], RuntimeError)
    assert actor.batches[1] == ["decision", 1, "poison", 3]
    assert actor.batches[2:] == [["decision"], [1], ["poison"], [3]]


async def test_an_unsendable_batch_keeps_the_profile_actor_channel():
    """A batch that can not be pickled is the batch's fault: the link keeps its same-node channel
    (it used to drop it and fall back to Ray calls for every request)."""
    from actors.channel import ChannelClient, ChannelServer, Unsendable
    from serve_app.ray_runner import ActorLink

    async def answer(items):
        return [x * 10 for x in items]

    server = ChannelServer(answer)
    await server.start()
    client = ChannelClient(server.port, server.token)
    await client.connect()
    link = ActorLink(handle=None)  # no Ray call may happen: the channel serves everything here
    link._client = client
    deep: list = []
    for _ in range(5000):
        deep = [deep]
    try:
        with pytest.raises(Unsendable):
            await link.run_batch([deep])
        assert link._client is client and not client.closed
        assert await link.run_batch([4]) == [40]
    finally:
        await client.close()
        await server.close()
