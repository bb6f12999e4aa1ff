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
    actor = FakeActor(delay=0.01, fail_on="poison")
    batcher = ActorBatcher(actor.send, max_in_flight=1, notify_delay_s=1.0)
    batcher.notify("poison")
    with pytest.raises(RuntimeError, match="actor died"):
        await batcher.call(1)
    assert await batcher.call(2) == 20
