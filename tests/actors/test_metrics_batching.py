"""How scrape reports are batched (no Ray cluster needed): the tick grid, the report batcher, the
datastore's batch report, and scrapers of one process sharing report calls."""

from __future__ import annotations

import asyncio

import pytest

from actors.datastore_core import DatastoreCore
from actors.options import ActorOptions, PodSpec
from actors.pod_state import PodRecord, PodState
from actors.report_batcher import ReportAbandoned, ReportBatcher
from actors.scrape_report import ScrapeReport
from actors.scrape_rules import after_scrape
from actors.scraper import PodScraper
from ray_epp.simulator import PodConfig, start_sim_pods_in_thread
from scheduler import Metrics


def test_after_scrape_keeps_the_tick_grid():
    interval = 0.05
    # on time: wait for the next tick
    tick, wait = after_scrape(200, 10.01, interval)
    assert tick == 201 and wait == pytest.approx(0.04)
    # overran its slot (by any amount): the next scrape at once...
    tick, wait = after_scrape(201, 10.16, interval)
    assert (tick, wait) == (203, 0.0)
    # ...and the one after that back on the grid: not a burst of the missed ones
    tick, wait = after_scrape(tick, 10.17, interval)
    assert tick == 204 and wait == pytest.approx(0.03)


async def test_report_batcher_sends_a_round_in_one_call():
    calls: list[list] = []

    async def send(entries):
        calls.append(entries)
        await asyncio.sleep(0.05)

    batcher = ReportBatcher(send, max_wait_s=0.01)
    entries = [(f"pod-{i}", None, "x", 1, 1) for i in range(5)]
    await asyncio.gather(*(batcher.report(e) for e in entries))
    assert calls == [entries] and batcher.calls == 1 and batcher.entries == 5

    # no window: the first report goes at once; those that come while it is in flight share the next call
    calls.clear()
    in_flight = asyncio.Event()

    async def held(entries):  # the first call stays in flight until the others have come
        calls.append(entries)
        if len(calls) == 1:
            await in_flight.wait()

    batcher = ReportBatcher(held, max_wait_s=0.0)
    first = asyncio.ensure_future(batcher.report(entries[0]))
    while not calls:
        await asyncio.sleep(0)
    rest = [asyncio.ensure_future(batcher.report(e)) for e in entries[1:3]]
    await asyncio.sleep(0)  # both reported, behind the call in flight
    assert len(calls) == 1
    in_flight.set()
    await asyncio.gather(first, *rest)
    assert calls == [[entries[0]], [entries[1], entries[2]]]


async def test_report_batcher_waits_for_the_rest_of_the_round_but_not_longer_than_max_wait():
    calls: list[tuple[float, list[str]]] = []
    loop = asyncio.get_running_loop()

    async def send(entries):
        calls.append((loop.time(), [e[0] for e in entries]))

    batcher = ReportBatcher(send, max_wait_s=5.0)  # far above any stall of a loaded machine
    start = loop.time()
    for _ in range(3):  # three scrapes of a round under way
        batcher.begin()
    first = batcher.report(("a", None, "x", 1, 1))
    batcher.end()
    await asyncio.sleep(0.03)
    second = batcher.report(("b", None, "x", 1, 1))
    batcher.end()
    await asyncio.sleep(0.03)
    assert calls == []  # the third scrape is still under way
    batcher.end()  # ...and has nothing to report: the round is through
    await asyncio.gather(first, second)
    assert [names for _, names in calls] == [["a", "b"]] and calls[0][0] - start < 2.5  # not max_wait_s

    # a scrape that hangs holds the round up for max_wait_s at most
    calls.clear()
    batcher = ReportBatcher(send, max_wait_s=0.2)
    batcher.begin()
    batcher.begin()
    start = loop.time()
    report = batcher.report(("a", None, "x", 1, 1))
    batcher.end()
    await asyncio.wait_for(report, 10.0)  # released by max_wait_s, not by the scrape that never ends
    assert [names for _, names in calls] == [["a"]] and 0.19 <= calls[0][0] - start < 2.0
    assert batcher.busy == 1


async def test_report_batcher_raises_the_calls_error_in_every_report_of_it():
    fail = True

    async def send(entries):
        if fail:
            raise RuntimeError("datastore unavailable")

    batcher = ReportBatcher(send, max_wait_s=0.005)
    results = await asyncio.gather(
        batcher.report(("a", None, "x", 1, 1)), batcher.report(("b", None, "x", 1, 1)), return_exceptions=True
    )
    assert [type(r) for r in results] == [RuntimeError, RuntimeError]
    fail = False
    await batcher.report(("a", None, "x", 2, 2))  # the next call goes out normally
    assert batcher.calls == 2


async def test_an_abandoned_call_fails_its_reports_and_lets_the_next_ones_go():
    # a call to a datastore that restarted meanwhile never answers: it must not hold later reports
    calls: list[list[str]] = []

    async def send(entries):
        calls.append([e.pod for e in entries])
        if len(calls) == 1:
            await asyncio.Event().wait()  # the dead incarnation

    batcher = ReportBatcher(send, max_wait_s=0.0)
    first = batcher.report(ScrapeReport("a", None, "x", 1, 1))
    await asyncio.sleep(0.01)
    second = batcher.report(ScrapeReport("b", None, "x", 1, 1))
    await asyncio.sleep(0.05)
    assert calls == [["a"]] and not second.done()  # held behind the call in flight
    batcher.abandon()
    await second
    with pytest.raises(ReportAbandoned):
        await first
    assert calls == [["a"], ["b"]]
    batcher.abandon()  # nothing in flight: nothing happens
    await batcher.report(ScrapeReport("c", None, "x", 1, 1))
    assert calls[-1] == ["c"]


def test_datastore_core_bumps_the_version_once_per_batch():
    core = DatastoreCore(ActorOptions(unhealthy_after_failures=2))
    for name in ("a", "b", "c"):
        core.pods[name] = PodRecord(PodSpec(name=name, address="127.0.0.1", port=1))
    v0 = core.version
    m = Metrics(waiting_queue_size=1, cache_num_blocks=10)
    assert core.report_batch([(n, m, None, 0, 0) for n in ("a", "b", "c")]) == 3
    assert core.version == v0 + 1 and {p.state for p in core.pods.values()} == {PodState.READY}
    assert [e.name for e in core.snapshot()[1]] == ["a", "b", "c"]

    # the same values, scraped later (a heartbeat): a new version all the same, whose snapshot has the
    # newer update_time (readers judge freshness by it)
    assert core.report_batch([(n, Metrics(1, cache_num_blocks=10, update_time=5.0), None, 0, 0) for n in "abc"]) == 3
    assert core.version == v0 + 2
    assert {e.metrics.update_time for e in core.snapshot()[1]} == {5.0}
    v0 += 1

    # two changes and a pod the datastore does not know (removed meanwhile): one bump, two known
    busy = Metrics(waiting_queue_size=7, cache_num_blocks=10)
    assert core.report_batch([("a", busy, None, 0, 0), ("b", busy, None, 0, 0), ("gone", busy, None, 0, 0)]) == 2
    assert core.version == v0 + 2
    assert {e.name: e.metrics.waiting_queue_size for e in core.snapshot()[1]} == {"a": 7, "b": 7, "c": 1}

    # failures count as the metrics actor says; the pod leaves the snapshot when unhealthy
    core.report_batch([("c", None, "GET: refused", 1, 1)])
    assert core.pods["c"].state is PodState.READY and core.version == v0 + 2
    core.report_batch([("c", None, "GET: refused", 2, 2)])
    assert core.pods["c"].state is PodState.UNHEALTHY and core.version == v0 + 3
    assert [e.name for e in core.snapshot()[1]] == ["a", "b"]
    assert core.pods["c"].last_error == "GET: refused" and core.pods["c"].total_failures == 2
    assert PodState.STARTING not in {p.state for p in core.pods.values()}


@pytest.fixture(scope="module")
def two_pods():
    with start_sim_pods_in_thread([PodConfig(name="p-0"), PodConfig(name="p-1")]) as cluster:
        yield cluster.pods


async def test_scrapers_of_one_process_share_report_calls(two_pods):
    calls: list[list] = []

    async def send(entries):
        calls.append([e[0] for e in entries])

    batcher = ReportBatcher(send, max_wait_s=0.01)
    options = ActorOptions(refresh_interval_s=0.02, heartbeat_s=0.2)
    scrapers = [
        PodScraper(
            PodSpec(name=p.name, address=p.address, port=p.port),
            options,
            lambda m, e, c, t, name=p.name: batcher.report((name, m, e, c, t)),
            round_tracker=batcher,
        )
        for p in two_pods
    ]
    def paired() -> int:
        return sum(c == ["p-0", "p-1"] or c == ["p-1", "p-0"] for c in calls)

    for s in scrapers:
        s.start()
    try:  # ~1.2 s on an idle machine; on a loaded one the scrapes come later, not fewer per report
        deadline = asyncio.get_running_loop().time() + 30.0
        while asyncio.get_running_loop().time() < deadline and not (
            sum(len(c) for c in calls) >= 2 * 5 and paired() >= 4 and min(s.counters.scrapes for s in scrapers) >= 40
        ):
            await asyncio.sleep(0.05)
    finally:
        for s in scrapers:
            await s.stop()
    entries = sum(len(c) for c in calls)
    # idle pods: the first reports, then a heartbeat per 0.2 s each, the two pods' in the same call
    assert entries >= 2 * 5, calls
    assert len(calls) <= entries * 0.6, calls
    assert paired() >= 4, calls
    for s in scrapers:  # an idle page is parsed once, then recognised as unchanged
        c = s.counters
        assert c.parses <= 2 and c.parse_skips >= c.scrapes - 2 and c.scrapes >= 40
