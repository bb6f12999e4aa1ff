"""A relay's answers without Ray: it follows the datastore's deltas (skipping versions, as a
follower does), and any reader, whether it read the relay or the datastore before, ends with
exactly the datastore's pool when it asks the relay, and a reader that is not behind is told
nothing changed."""

from __future__ import annotations

import pickle
import random

from actors.snapshot_delta import DeltaLog, PoolCopy
from actors.snapshot_relay import RelayedPool
from scheduler import Endpoint, Metrics


def ep(name: str, queue: int = 0) -> Endpoint:
    return Endpoint(name, "10.0.0.1", 8000, {}, Metrics(waiting_queue_size=queue))


def content(pool: PoolCopy) -> dict:
    return {n: e.metrics.waiting_queue_size for n, e in pool.by_name.items()}


def test_readers_switching_between_relay_and_datastore_end_with_the_datastores_pool():
    rng = random.Random(11)
    datastore = DeltaLog(first_version=1000, max_tombstones=16)
    relay = RelayedPool()
    readers = [PoolCopy() for _ in range(5)]
    current: dict[str, Endpoint] = {f"p{i}": ep(f"p{i}") for i in range(20)}
    version = 1000
    for _ in range(400):
        version += rng.randint(1, 3)
        for _ in range(rng.randint(0, 5)):
            name = f"p{rng.randrange(30)}"
            if name in current and rng.random() < 0.3:
                del current[name]
            else:
                current[name] = ep(name, rng.randrange(100))
        endpoints = list(current.values())
        if rng.random() < 0.6:  # the relay skips some versions (its own watch is a long-poll)
            relay.take(datastore.packed(relay.version, version, endpoints))
        for reader in readers:
            if rng.random() < 0.3:  # fell back to the datastore for a while
                reader.apply(datastore.packed(reader.version, version, endpoints))
            elif relay.version > reader.version:
                reader.apply(relay.answer(reader.version))
        relay.take(datastore.packed(relay.version, version, endpoints))
        for reader in readers:
            reader.apply(relay.answer(reader.version))
            assert reader.version == version
            assert content(reader) == {n: e.metrics.waiting_queue_size for n, e in current.items()}


def test_a_reader_not_behind_the_relay_is_told_nothing_changed():
    datastore, relay = DeltaLog(first_version=10), RelayedPool()
    assert pickle.loads(relay.answer(0)).version == 0  # nothing held yet: nothing to tell
    relay.take(datastore.packed(0, 11, [ep("a"), ep("b")]))
    reader = PoolCopy()
    reader.apply(relay.answer(0))
    assert reader.version == 11 and sorted(reader.by_name) == ["a", "b"]
    assert reader.apply(relay.answer(11)) is None
    ahead = PoolCopy()  # read the datastore's newer version while the relay lags
    ahead.apply(datastore.packed(0, 12, [ep("a", 3)]))
    assert ahead.apply(relay.answer(12)) is None and ahead.version == 12 and content(ahead) == {"a": 3}


def test_a_reader_from_before_the_relay_started_gets_the_whole_pool():
    datastore = DeltaLog(first_version=10)
    early = PoolCopy()
    early.apply(datastore.packed(0, 11, [ep("a"), ep("b")]))
    datastore.packed(11, 12, [ep("a", 1), ep("b")])
    relay = RelayedPool()
    relay.take(datastore.packed(0, 13, [ep("a", 1), ep("c")]))
    delta = pickle.loads(relay.answer(early.version))
    assert delta.full
    early.apply(relay.answer(early.version))
    assert content(early) == {"a": 1, "c": 0}
