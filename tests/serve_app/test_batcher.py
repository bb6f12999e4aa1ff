"""ActorBatcher: coalescing, order, notifications and failures, with a fake actor method."""

from __future__ import annotations

import asyncio

import pytest

from serve_app.gateway.batcher import ActorBatcher


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


async def test_a_call_never_overtakes_notifications_already_leaving():
    """The lone notifications' timer fires in the same loop turn as the answer a request was
    waiting for (e.g. its first profile round's): they leave as a task that has not sent yet when
    the request's next call arrives at an idle batcher. The call must not go out first, or the
    actor decides it without the events sent before it."""
    actor = FakeActor()
    batcher = ActorBatcher(actor.send, notify_delay_s=0.0)
    loop = asyncio.get_running_loop()
    answer = loop.create_future()

    async def next_round() -> int:
        await answer
        return await batcher.call(2)

    request = asyncio.ensure_future(next_round())
    await asyncio.sleep(0)  # the request waits for its answer
    loop.call_later(0, answer.set_result, None)  # wakes the request ...
    batcher.notify("decision-1")  # ... in the turn the notification's timer fires
    assert await request == 20
    assert actor.batches == [["decision-1"], [2]]


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
    from serve_app.gateway.ray_runner import ActorLink

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


async def test_a_batch_does_not_overtake_an_earlier_one_when_the_channel_comes_up():
    """While a batch is on its way as a Ray call, a channel that has just connected is not used:
    the next batch (a decision, say) could otherwise reach the actor before the events sent ahead
    of it. Once no Ray call is left, the channel serves."""
    from actors.channel import ChannelClient, ChannelServer
    from serve_app.gateway.ray_runner import ActorLink

    order: list[tuple[str, list]] = []

    class Method:  # a Ray actor method's `.remote(...)`: an awaitable
        def __init__(self, fn) -> None:
            self.remote = fn

    class SlowActorHandle:
        def __init__(self) -> None:
            self.run_batch = Method(self._run_batch)
            self.channel_endpoint = Method(self._no_channel)

        async def _run_batch(self, items: list) -> list:
            order.append(("ray", list(items)))
            await asyncio.sleep(0.05)
            return [x * 10 for x in items]

        async def _no_channel(self):
            return None

    async def by_channel(items):
        order.append(("channel", list(items)))
        return [x * 10 for x in items]

    server = ChannelServer(by_channel)
    await server.start()
    client = ChannelClient(server.port, server.token)
    await client.connect()
    link = ActorLink(SlowActorHandle())
    try:
        first = asyncio.create_task(link.run_batch([1]))
        await asyncio.sleep(0.01)  # the first batch is on its way as a Ray call
        link._client = client  # and now the channel is up
        assert await link.run_batch([2]) == [20]
        assert await first == [10]
        assert await link.run_batch([3]) == [30]
        assert order == [("ray", [1]), ("ray", [2]), ("channel", [3])]
    finally:
        await client.close()
        await server.close()
