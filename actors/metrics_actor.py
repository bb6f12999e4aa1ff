"""The Ray actor that scrapes a group of pods (the datastore groups them by Ray node,
`actors/metrics_groups.py`): one `PodScraper` per pod in one event loop, and what they have to
report sent to the datastore in one call per scrape round (`ReportBatcher`), not one call per pod
and change. A Ray actor call costs milliseconds of CPU on each side and an actor process costs
memory and idle CPU, so N pods cost one process and at most ~20 calls a second instead of N
processes and up to N x 20 calls (bench/metrics_path_cpu.py). The actor starts scraping as soon as
it is constructed, so a restarted actor (max_restarts=-1) resumes without being told to; a
restarted one asks the datastore for its current pod list."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

import ray
from ray.exceptions import ActorDiedError

from actors.options import PodSpec, as_options, as_pod
from actors.report_batcher import ReportBatcher
from actors.scrape_report import ScrapeReport
from actors.scraper import PodScraper
from scheduler import ServedModel
from scheduler.engine_metrics import EngineRegistry

log = logging.getLogger("ray_epp.actors.metrics_actor")


@ray.remote
class NodeMetricsActor:
    """The scrapers of a group of pods (the datastore groups them by Ray node) in one Ray actor,
    reporting to the datastore in batches. Created by the datastore (detached, named
    `<datastore>:metrics:<group>`, max_restarts=-1); if its datastore is gone for good it kills
    itself, so no orphan keeps scraping."""

    def __init__(
        self,
        specs: list[dict[str, Any] | PodSpec],
        datastore: Any,
        options: dict[str, Any] | None = None,
        group: str = "",
    ) -> None:
        self._options = as_options(options)
        self._datastore = datastore
        self._group = group
        extractor = self._options.metrics_extractor
        self._registry = EngineRegistry.from_params(extractor) if extractor else None
        self._scrapers: dict[str, PodScraper] = {}
        self._batcher = ReportBatcher(self._send, self._options.report_batch_max_wait_s)
        self._exit_task: asyncio.Task | None = None
        self._started_cpu = time.process_time()
        self._started = time.monotonic()
        for spec in specs:
            self._add(as_pod(spec))
        self._refetch: asyncio.Task | None = None
        if ray.get_runtime_context().was_current_actor_reconstructed:
            # the constructor's pod list is the one this actor was created with: ask for today's
            self._refetch = asyncio.get_running_loop().create_task(self._fetch_pods())

    def _add(self, spec: PodSpec) -> None:
        name = spec.name
        scraper = PodScraper(
            spec,
            self._options,
            lambda m, e, c, t: self._batcher.report(ScrapeReport(name, m, e, c, t)),
            lambda models: self._report_models(name, models),
            registry=self._registry,
            round_tracker=self._batcher,
        )
        self._scrapers[name] = scraper
        scraper.start()

    async def _send(self, reports: list[ScrapeReport]) -> None:
        try:
            async with asyncio.timeout(max(2.0, self._options.scrape_timeout_s)):
                await self._datastore.report_batch.remote(reports)
        except ActorDiedError:
            self._exit_when_orphaned()
            raise

    def _exit_when_orphaned(self) -> None:
        if self._exit_task is None:
            log.warning("the datastore of metrics actor %s is gone for good: it exits", self._group)
            self._exit_task = asyncio.get_running_loop().create_task(self._exit())

    async def _exit(self) -> None:
        await self._stop_all()  # from its own task: the scrape tasks are the ones being cancelled
        ray.kill(ray.get_runtime_context().current_actor, no_restart=True)

    async def _stop_all(self) -> None:
        await asyncio.gather(*(s.stop() for s in self._scrapers.values()))
        self._batcher.close()

    async def _report_models(self, name: str, models: list[ServedModel]) -> None:
        async with asyncio.timeout(5.0):
            await self._datastore.report_models.remote(name, models)

    async def _fetch_pods(self) -> None:
        for _ in range(120):
            try:
                async with asyncio.timeout(30.0):
                    specs = await self._datastore.pods_of_metrics_actor.remote(self._group)
            except ActorDiedError:
                self._exit_when_orphaned()
                return
            except Exception as err:  # the datastore is restarting too: try again
                log.debug("metrics actor %s: pod list not available yet: %s", self._group, err)
                await asyncio.sleep(1.0)
                continue
            if specs is None:  # the datastore has retired this group
                self._exit_when_orphaned()
            else:
                await self.set_pods(specs)
            return

    def _pick(self, pod: str | None) -> list[PodScraper]:
        if pod is None:
            return list(self._scrapers.values())
        if pod not in self._scrapers:
            raise KeyError(f"metrics actor {self._group!r} does not scrape pod {pod!r}")
        return [self._scrapers[pod]]

    # --- the API (the datastore's, and stats for benchmarks and tests) -------------------------

    async def set_pods(self, specs: list[dict[str, Any] | PodSpec]) -> list[str]:
        """Scrape exactly these pods: stop the others, restart those whose spec changed."""
        wanted = {s.name: s for s in map(as_pod, specs)}
        gone = [n for n, s in self._scrapers.items() if wanted.get(n) != s.spec]
        await asyncio.gather(*(self._scrapers.pop(n).stop() for n in gone))
        for name, spec in wanted.items():
            if name not in self._scrapers:
                self._add(spec)
        return sorted(self._scrapers)

    async def pod_specs(self) -> list[dict[str, Any]]:
        return [s.spec.model_dump() for s in self._scrapers.values()]

    async def start(self, pod: str | None = None) -> bool:
        """(Re)start scraping one pod, or every pod; True when one was not running."""
        return any([s.start() for s in self._pick(pod)])

    async def stop(self, pod: str | None = None) -> bool:
        """Stop scraping one pod, or every pod; True when one was running."""
        return any(await asyncio.gather(*(s.stop() for s in self._pick(pod))))

    async def resync(self) -> None:
        """The datastore (re)started and knows nothing yet: every pod's state again, at once."""
        self._batcher.abandon()  # a call in flight went to the dead incarnation
        for scraper in self._scrapers.values():
            scraper.resync()

    async def stats(self, pod: str | None = None) -> dict[str, Any]:
        """One pod's scrape stats, or (no pod) the totals of this actor."""
        if pod is not None:
            return {**self._pick(pod)[0].stats(), "group": self._group}
        counters = [s.counters for s in self._scrapers.values()]
        parses = sum(c.parses for c in counters)
        parse_s = sum(c.parse_seconds for c in counters)
        totals = {k: sum(getattr(c, k) for c in counters) for k in ("scrapes", "failures", "reports", "report_errors")}
        return {
            "group": self._group,
            "pid": os.getpid(),
            "pods": sorted(self._scrapers),
            **totals,
            "report_calls": self._batcher.calls,
            "parses": parses,
            "parse_skips": sum(c.parse_skips for c in counters),
            "parse_us_avg": round(parse_s / max(1, parses) * 1e6, 1),
            "process_cpu_s": round(time.process_time() - self._started_cpu, 4),
            "uptime_s": round(time.monotonic() - self._started, 3),
        }
