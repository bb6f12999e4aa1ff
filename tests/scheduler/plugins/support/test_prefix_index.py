"""The prefix index (scheduler.plugins.support.prefix.index): GIE's approximateprefix/indexer_test.go cases, the
longest-prefix match of plugin.go's matchLongestPrefix, and a randomised check against a plain
model of per-server LRUs."""

import asyncio
import random
from collections import OrderedDict

import pytest

from scheduler.plugins.support.prefix import DEFAULT_LRU_CAPACITY_PER_SERVER, PrefixIndex


def test_default_capacity_is_gies():
    assert DEFAULT_LRU_CAPACITY_PER_SERVER == 31250
    assert PrefixIndex().default_capacity == 31250


def test_add_and_get_server_capacity_takes_precedence():
    index = PrefixIndex(default_capacity=3)  # larger than the server's own size of 2
    index.add([1], "server1", capacity=2)
    assert index.server_size("server1") == 1
    assert index.get(1) == {"server1"}

    index.add([2], "server1")
    assert index.server_size("server1") == 2

    index.add([3], "server1")  # evicts hash 1
    assert index.server_size("server1") == 2
    assert index.server_capacity("server1") == 2
    assert index.get(1) == set()
    assert index.get(4) == set()


def test_remove_server_and_eviction():
    size = 10
    index = PrefixIndex(default_capacity=size)
    for h in range(size):
        index.add([h], "server1")
        index.add([h], "server2")
    assert index.server_size("server1") == size
    assert index.server_size("server2") == size
    for h in range(size):
        assert index.get(h) == {"server1", "server2"}

    index.add([size], "server1")  # server1 evicts hash 0
    assert index.server_size("server1") == size
    assert index.get(0) == {"server2"}

    assert index.remove_server("server2") is True
    assert index.get(0) == set()
    for h in range(1, size + 1):
        assert index.get(h) == {"server1"}
    assert len(index) == size
    assert index.servers() == ["server1"]
    assert index.remove_server("server2") is False


@pytest.mark.parametrize("remove_first", [False, True])
def test_add_and_remove_from_one_event_loop(remove_first):
    """GIE's concurrent add/remove test, on one asyncio loop (our concurrency model): whatever the
    order, a removed server is referenced by no hash."""

    async def scenario():
        index = PrefixIndex(default_capacity=10)

        async def add():
            index.add([1, 2, 3], "pod1")

        async def remove():
            index.remove_server("pod1")

        tasks = [remove(), add()] if remove_first else [add(), remove()]
        await asyncio.gather(*tasks)
        return index

    for _ in range(20):
        index = asyncio.run(scenario())
        if "pod1" not in index.servers():
            assert all("pod1" not in index.get(h) for h in (1, 2, 3))
            assert len(index) == 0
        else:
            assert index.get(1) == {"pod1"}


@pytest.mark.parametrize(
    ("adds", "query", "expected"),
    [
        pytest.param([], [1, 2, 3], {}, id="empty index"),
        pytest.param([([1, 2, 3], "a")], [], {}, id="no hashes"),
        pytest.param([([1, 2, 3], "a")], [1, 2, 3], {"a": 3}, id="full match"),
        pytest.param([([1, 2], "a")], [1, 2, 3, 4], {"a": 2}, id="prefix match"),
        pytest.param([([1, 2, 3], "a"), ([1], "b")], [1, 2, 3], {"a": 3, "b": 1}, id="two depths"),
        pytest.param([([2, 3], "a")], [1, 2, 3], {}, id="first block unknown: walk stops at once"),
        pytest.param([([1, 3], "a")], [1, 2, 3], {"a": 1}, id="stops at the first block no server holds"),
        pytest.param(
            [([1, 3], "a"), ([2], "b")],
            [1, 2, 3],
            {"a": 2, "b": 1},
            id="a server counts the walked blocks it holds, not only leading ones",
        ),
        pytest.param(
            [([1, 2, 3, 4], "a"), ([1, 2], "b"), ([1, 2, 3, 4], "c")],
            [1, 2, 3, 4, 5],
            {"a": 4, "b": 2, "c": 4},
            id="runs of equal server sets",
        ),
    ],
)
def test_longest_prefix_match(adds, query, expected):
    index = PrefixIndex(default_capacity=100)
    for hashes, server in adds:
        index.add(hashes, server)
    assert index.match(query) == expected


def test_readding_a_hash_makes_it_most_recent():
    index = PrefixIndex(default_capacity=2)
    index.add([1, 2], "s")
    index.add([1], "s")  # 1 is now the most recent
    index.add([3], "s")  # so 2 is evicted
    assert index.get(1) == {"s"}
    assert index.get(2) == set()
    assert index.get(3) == {"s"}


def test_one_add_larger_than_the_capacity_keeps_the_newest():
    index = PrefixIndex(default_capacity=2)
    index.add([1, 2, 3, 4], "s")
    assert index.server_size("s") == 2
    assert [index.get(h) for h in (1, 2, 3, 4)] == [set(), set(), {"s"}, {"s"}]
    assert len(index) == 2


def test_capacity_is_fixed_when_a_server_is_first_seen():
    index = PrefixIndex(default_capacity=5)
    index.add([1], "s")
    index.add([2], "s", capacity=1)
    assert index.server_capacity("s") == 5
    index.add([1], "t", capacity=0)  # no size known: the default
    assert index.server_capacity("t") == 5


def test_removed_server_slot_is_reused_cleanly():
    index = PrefixIndex(default_capacity=10)
    index.add([1, 2], "a")
    index.add([1, 2, 3], "b")
    index.remove_server("a")
    index.add([3], "c")  # takes a's slot
    assert index.get(1) == {"b"}
    assert index.get(3) == {"b", "c"}
    assert index.match([1, 2, 3]) == {"b": 3, "c": 1}


def test_capacity_must_be_positive():
    with pytest.raises(ValueError, match="capacity"):
        PrefixIndex(default_capacity=0)


class ModelIndex:
    """Per-server LRUs and nothing else; who holds a hash is computed by scanning them."""

    def __init__(self, capacity):
        self.capacity = capacity
        self.lrus: dict[str, OrderedDict] = {}

    def add(self, hashes, server):
        lru = self.lrus.setdefault(server, OrderedDict())
        for h in hashes:
            lru[h] = None
            lru.move_to_end(h)
            if len(lru) > self.capacity:
                lru.popitem(last=False)

    def remove_server(self, server):
        self.lrus.pop(server, None)

    def get(self, h):
        return {s for s, lru in self.lrus.items() if h in lru}

    def match(self, hashes):
        counts: dict[str, int] = {}
        for h in hashes:
            holders = self.get(h)
            if not holders:
                break
            for s in holders:
                counts[s] = counts.get(s, 0) + 1
        return counts


@pytest.mark.parametrize("seed", range(5))
def test_agrees_with_a_plain_model_under_random_operations(seed):
    rng = random.Random(seed)
    capacity = rng.choice([3, 8, 20])
    index, model = PrefixIndex(default_capacity=capacity), ModelIndex(capacity)
    servers = [f"s{i}" for i in range(70)]  # more servers than a machine word has bits
    for _ in range(600):
        op = rng.random()
        if op < 0.6:
            start = rng.randrange(8)
            hashes = list(range(start, start + rng.randrange(1, 12)))
            server = rng.choice(servers)
            index.add(hashes, server)
            model.add(hashes, server)
        elif op < 0.7:
            server = rng.choice(servers)
            index.remove_server(server)
            model.remove_server(server)
        else:
            start = rng.randrange(4)
            query = list(range(start, start + rng.randrange(1, 15)))
            assert index.match(query) == model.match(query)
    for h in range(25):
        assert index.get(h) == model.get(h)
    assert sorted(index.servers()) == sorted(model.lrus)
    for server, lru in model.lrus.items():
        assert index.server_size(server) == len(lru)
