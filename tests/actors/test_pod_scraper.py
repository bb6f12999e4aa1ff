"""The scrape loop without Ray: what it reports, and when, against a simulated vLLM pod."""

from __future__ import annotations

import asyncio

import pytest

from actors.options import ActorOptions, PodSpec
from actors.scraper import PodScraper, model_ids, served_models
from ray_epp.simulator import PodConfig, start_sim_pods_in_thread


@pytest.fixture(scope="module")
def pod():
    with start_sim_pods_in_thread([PodConfig(name="solo", num_gpu_blocks=1234)]) as cluster:
        yield cluster.pods[0]


async def test_reports_on_change_and_heartbeat_and_throttles_failures(pod):
    reports: list[tuple] = []
    models: list[list[str]] = []

    async def report(metrics, error, consecutive, total):
        reports.append((metrics, error, consecutive, total))

    async def report_models(served):
        models.append([m.id for m in served])

    options = ActorOptions(refresh_interval_s=0.02, heartbeat_s=0.25, unhealthy_after_failures=3, scrape_timeout_s=0.5)
    scraper = PodScraper(PodSpec(name=pod.name, address=pod.address, port=pod.port), options, report, report_models)
    assert scraper.start() and not scraper.start()  # idempotent
    try:
        await asyncio.sleep(0.8)
        ok = [r for r in reports if r[0] is not None]
        assert ok and ok[0][0].cache_num_blocks == 1234 and ok[0][1] is None
        assert scraper.counters.scrapes >= 15
        assert 2 <= len(ok) <= 6  # idle pod: the first report, then heartbeats only
        assert models == [["meta-llama/Llama-3.1-8B-Instruct"]]

        reports.clear()
        pod.set_failures({"metrics_garbage_rate": 1.0})
        await asyncio.sleep(0.8)
        failures = [r for r in reports if r[0] is None]
        assert failures and all("bad metrics" in r[1] for r in failures)
        assert [r[2] for r in failures[:3]] == [1, 2, 3]  # one by one until unhealthy...
        assert len(failures) <= 3 + 4  # ...then once per heartbeat
        assert scraper.counters.consecutive_failures > len(failures)

        reports.clear()
        pod.set_failures({})
        await asyncio.sleep(0.1)
        assert reports and reports[0][0] is not None  # recovery is reported at once, though unchanged
        stats = scraper.stats()
        assert stats["engine"] == "vllm" and stats["failures"] >= 10 and stats["parse_us_avg"] > 0
    finally:
        pod.set_failures({})
        assert await scraper.stop()
    assert not scraper.running


async def test_unreachable_pod_is_a_failure_with_the_reason():
    reports = []

    async def report(metrics, error, consecutive, total):
        reports.append(error)

    options = ActorOptions(scrape_timeout_s=0.2)
    scraper = PodScraper(PodSpec(name="gone", address="127.0.0.1", port=9), options, report)
    await scraper.scrape_once()
    await scraper.stop()
    assert reports and "GET http://127.0.0.1:9/metrics" in reports[0]


def test_model_ids():
    assert model_ids({"data": [{"id": "b"}, {"id": "a"}, {"id": "a"}, {"x": 1}, "junk"]}) == ["a", "b"]
    with pytest.raises(ValueError):
        model_ids({"object": "list"})


def test_served_models_keep_the_adapters_parent():
    payload = {"data": [{"id": "lora", "parent": "base", "owned_by": "vllm"}, {"id": "base", "parent": None}]}
    assert [(m.id, m.parent) for m in served_models(payload)] == [("base", ""), ("lora", "base")]


async def test_resync_re_sends_the_served_models_at_once(pod):
    # a restarted datastore knows no served models until each scraper sends them again: not at the
    # next refresh (here 30 s away), at once
    models: list[list[str]] = []

    async def report(metrics, error, consecutive, total):
        return None

    async def report_models(served):
        models.append([m.id for m in served])

    options = ActorOptions(refresh_interval_s=0.05, models_refresh_s=30.0)
    scraper = PodScraper(PodSpec(name=pod.name, address=pod.address, port=pod.port), options, report, report_models)
    scraper.start()
    try:
        async with asyncio.timeout(5):
            while not models:
                await asyncio.sleep(0.01)
        scraper.resync()
        async with asyncio.timeout(1):
            while len(models) < 2:
                await asyncio.sleep(0.01)
        assert models == [["meta-llama/Llama-3.1-8B-Instruct"]] * 2
    finally:
        await scraper.stop()
