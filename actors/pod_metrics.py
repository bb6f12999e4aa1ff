"""Scrape model servers' Prometheus `/metrics` every 50 ms, map each page to `Metrics` with the
pod's engine preset, and tell the datastore what changed.

`PodScraper` is one pod's loop in plain asyncio (report callbacks injected, so the benchmark can run
it without Ray). `NodeMetricsActor` is the Ray actor: it runs the scrapers of every pod of one Ray
node (or of one shard of them, see `ActorOptions.max_pods_per_metrics_actor`) in one event loop,
and sends what they have to report to the datastore in one call per scrape round
(`ReportBatcher`), not one call per pod and change. A Ray actor call costs milliseconds of CPU on
each side and an actor process costs memory and idle CPU, so N pods cost one process and at most
~20 calls a second instead of N processes and up to N x 20 calls (bench/metrics_path_cpu.py). The
actor starts scraping as soon as it is constructed, so a restarted actor (max_restarts=-1) resumes
without being told to; a restarted one asks the datastore for its current pod list."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import aiohttp
import ray
from ray.exceptions import ActorDiedError

from actors.http_get import HttpError, KeepAliveGet
from actors.options import ActorOptions, PodSpec, as_options, as_pod
from scheduler import Metrics
from scheduler.engine_metrics import DEFAULT_REGISTRY, EngineRegistry, parse_metrics

log = logging.getLogger("ray_epp.actors.pod_metrics")

# Called with (metrics, error, consecutive failures, total failures); returns what to await. It
# should queue the report before it returns (ReportBatcher.report does), not when awaited.
ReportFn = Callable[[Metrics | None, str | None, int, int], Awaitable[None]]
ModelsFn = Callable[[list[str]], Awaitable[None]]


def after_scrape(tick: int, now: float, interval: float) -> tuple[int, float]:
    """(the tick of the next scrape, how long to wait for it) after the scrape of tick `tick`
    (tick k is at k x interval on the monotonic clock) ended at `now`. Every scraper of a process
    wakes on the same ticks, so one round's reports go to the datastore together. On time: the next
    tick. Late (the scrape overran its slot): the next scrape at once, and the one after it on the
    grid again; never a burst to catch up."""
    due = (tick + 1) * interval
    if now < due:
        return tick + 1, due - now
    return math.floor(now / interval), 0.0


def same_metrics(a: Metrics | None, b: Metrics | None) -> bool:
    """Equal apart from update_time (which changes on every scrape)."""
    if a is None or b is None:
        return a is b
    return (
        a.waiting_queue_size == b.waiting_queue_size
        and a.running_requests_size == b.running_requests_size
        and a.kv_cache_usage_percent == b.kv_cache_usage_percent
        and a.active_models == b.active_models
        and a.waiting_models == b.waiting_models
        and a.max_active_models == b.max_active_models
        and a.cache_block_size == b.cache_block_size
        and a.cache_num_blocks == b.cache_num_blocks
    )


def model_ids(payload: Any) -> list[str]:
    """Model ids of an OpenAI `/v1/models` answer (base models and LoRA adapters)."""
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, list):
        raise ValueError("no 'data' list in the /v1/models answer")
    return sorted({m["id"] for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)})


class PodScraper:
    """Scrapes one pod in a loop, on the ticks of `after_scrape`. Reports a success when the metrics
    changed or a heartbeat is due (`heartbeat_s`, see `_heartbeat_due`); reports failures one by
    one until the pod would be unhealthy, then once per heartbeat. An unchanged page is not parsed
    again."""

    def __init__(
        self,
        spec: PodSpec,
        options: ActorOptions,
        report: ReportFn,
        report_models: ModelsFn | None = None,
        registry: EngineRegistry | None = None,
        round_tracker: ReportRound | None = None,
    ) -> None:
        self.spec = spec
        self._round = round_tracker
        self._round_open = False
        self.options = options
        if registry is None:
            registry = EngineRegistry.from_params(options.metrics_extractor) if options.metrics_extractor else None
        self.engine = (registry or DEFAULT_REGISTRY).for_labels(spec.labels)
        self.url = spec.base_url + options.metrics_path
        self.models_url = spec.base_url + options.models_path
        self._report = report
        self._report_models = report_models
        self._session: aiohttp.ClientSession | None = None
        self._fast = options.http_client == "fast"
        self._metrics_conn = KeepAliveGet(spec.address, spec.port, options.scrape_timeout_s)
        self._models_conn = KeepAliveGet(spec.address, spec.port, max(options.scrape_timeout_s, 5.0))
        self._task: asyncio.Task | None = None
        self._models_task: asyncio.Task | None = None
        self._started_cpu = time.process_time()
        self._started = time.monotonic()
        # what the last report said
        self._reported: Metrics | None = None
        self._reported_at = 0.0
        self._force = True
        self.last_metrics: Metrics | None = None
        self.models: list[str] | None = None
        self._reported_models: list[str] | None = None
        # counters
        self.scrapes = 0
        self.failures = 0
        self.consecutive_failures = 0
        self.reports = 0
        self.report_errors = 0
        self.parse_seconds = 0.0
        self.parses = 0
        self.parse_skips = 0
        self._last_body: bytes | None = None
        self._last_parsed: tuple[Metrics | None, str | None] | None = None
        self.last_error: str | None = None
        self.last_warning: str | None = None
        self.last_success: float | None = None

    # --- lifecycle -----------------------------------------------------------------------------

    def start(self) -> bool:
        """Start the loop on the running event loop; False if it already runs."""
        if self._task is not None and not self._task.done():
            return False
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"scrape {self.spec.name}")
        return True

    async def stop(self) -> bool:
        was_running = self._task is not None and not self._task.done()
        for task in (self._task, self._models_task):
            while task is not None and not task.done():
                task.cancel()
                await asyncio.wait({task}, timeout=1.0)  # cancel again if it was swallowed
        self._task = self._models_task = None
        if self._session is not None:
            await self._session.close()
            self._session = None
        await self._metrics_conn.close()
        await self._models_conn.close()
        return was_running

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def resync(self) -> None:
        """Report on the next scrape even if nothing changed, and re-send the served models."""
        self._force = True
        self._reported_models = None

    # --- the loop ------------------------------------------------------------------------------

    def _session_or_new(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.options.scrape_timeout_s),
                connector=aiohttp.TCPConnector(limit=2, ttl_dns_cache=300),
            )
        return self._session

    async def _run(self) -> None:
        interval = self.options.refresh_interval_s
        self._models_task = asyncio.get_running_loop().create_task(self._models_loop())
        tick = math.floor(time.monotonic() / interval)  # the first scrape at once, the next ones on the ticks
        while True:
            try:
                await self.scrape_once()
            except asyncio.CancelledError:
                raise
            except ActorDiedError:  # the datastore is gone for good: nobody to report to
                return
            except Exception as err:  # never let the loop die
                log.exception("scrape loop of %s: %s", self.spec.name, err)
            now = time.monotonic()
            tick, wait = after_scrape(tick, now, interval)
            if wait > 0:
                await asyncio.sleep(wait)

    async def scrape_once(self) -> None:
        """One scrape, parse and (maybe) report."""
        self.scrapes += 1
        if self._round is not None:
            self._round.begin()
            self._round_open = True
        try:
            await self._scrape_and_report()
        finally:
            self._close_round()

    def _close_round(self) -> None:
        """This scrape has said what it had to say (or has nothing to say): the round need not
        wait for it any more."""
        if self._round_open:
            self._round_open = False
            assert self._round is not None
            self._round.end()

    async def _scrape_and_report(self) -> None:
        metrics, error = await self._fetch_and_parse()
        now = time.monotonic()
        if error is None:
            assert metrics is not None
            metrics.update_time = time.time()
            self.last_metrics = metrics
            self.last_success = now
            self.consecutive_failures = 0
            since = now - self._reported_at
            changed = since >= self.options.min_report_interval_s and not same_metrics(metrics, self._reported)
            if self._force or changed or self._heartbeat_due(now):
                await self._send(metrics, None, now)
            return
        self.failures += 1
        self.consecutive_failures += 1
        self.last_error = error
        if (
            self._force
            or self.consecutive_failures <= self.options.unhealthy_after_failures
            or self._heartbeat_due(now)
        ):
            await self._send(None, error, now)

    def _heartbeat_due(self, now: float) -> bool:
        """A heartbeat is due when a multiple of heartbeat_s passed since the last report: at most
        heartbeat_s (plus a scrape interval) apart, and on the same tick for every scraper of a
        process, so their heartbeats share one report call."""
        beat = self.options.heartbeat_s
        return math.floor(now / beat) != math.floor(self._reported_at / beat)

    async def _get(self, conn: KeepAliveGet, url: str, path: str) -> tuple[int, bytes]:
        """(status, body) with the configured client; raises HttpError."""
        if self._fast:
            return await conn.get(path)
        try:
            async with self._session_or_new().get(url) as resp:
                return resp.status, await resp.read()
        except TimeoutError:
            raise HttpError(f"timed out after {self.options.scrape_timeout_s:g}s") from None
        except (aiohttp.ClientError, OSError) as err:
            raise HttpError(f"{type(err).__name__}: {err}") from None

    async def _fetch_and_parse(self) -> tuple[Metrics | None, str | None]:
        try:
            status, body = await self._get(self._metrics_conn, self.url, self.options.metrics_path)
        except HttpError as err:
            return None, f"GET {self.url}: {err}"
        if status != 200:
            return None, f"GET {self.url}: HTTP {status}"
        if body == self._last_body and self._last_parsed is not None:
            # the same page as last time (an idle server): the same outcome, without parsing it again
            self.parse_skips += 1
            metrics, error = self._last_parsed
            return (None if metrics is None else replace(metrics)), error
        start = time.perf_counter()
        result = parse_metrics(body.decode("utf-8", "replace"), self.engine, self.last_metrics)
        self.parse_seconds += time.perf_counter() - start
        self.parses += 1
        self.last_warning = "; ".join(result.warnings) if result.warnings else None
        if result.ok:
            outcome: tuple[Metrics | None, str | None] = (result.metrics, None)
        else:
            outcome = None, f"bad metrics from {self.url} (engine {self.engine.name}): {result.error}"
        self._last_body, self._last_parsed = body, (None if outcome[0] is None else replace(outcome[0]), outcome[1])
        return outcome

    async def _send(self, metrics: Metrics | None, error: str | None, now: float) -> None:
        try:
            sent = self._report(metrics, error, self.consecutive_failures, self.failures)  # queued (batcher)
            self._close_round()
            await sent
        except asyncio.CancelledError:
            raise
        except Exception as err:
            self.report_errors += 1
            self._force = True  # say it again next time: the datastore may have lost it
            if isinstance(err, ActorDiedError):
                raise
            log.debug("report of %s failed: %s", self.spec.name, err)
            return
        self.reports += 1
        self._reported = metrics  # after a failure (None) the next success is always reported
        self._reported_at = now
        self._force = False

    async def _models_loop(self) -> None:
        while True:
            ok = await self._fetch_models()
            if ok and self._report_models is not None and self.models != self._reported_models:
                try:
                    await self._report_models(list(self.models or []))
                    self._reported_models = self.models
                except asyncio.CancelledError:
                    raise
                except Exception as err:
                    log.debug("models report of %s failed: %s", self.spec.name, err)
                    ok = False
            # until the first success (the server may still be starting), try every second
            await asyncio.sleep(self.options.models_refresh_s if ok else min(1.0, self.options.models_refresh_s))

    async def _fetch_models(self) -> bool:
        try:
            status, body = await self._get(self._models_conn, self.models_url, self.options.models_path)
            if status != 200:
                return False
            self.models = model_ids(json.loads(body))
            return True
        except (HttpError, ValueError):
            return False

    def stats(self) -> dict[str, Any]:
        now = time.monotonic()
        return {
            "pod": self.spec.name,
            "pid": os.getpid(),
            "url": self.url,
            "engine": self.engine.name,
            "running": self.running,
            "scrapes": self.scrapes,
            "failures": self.failures,
            "consecutive_failures": self.consecutive_failures,
            "reports": self.reports,
            "report_errors": self.report_errors,
            "last_error": self.last_error,
            "last_warning": self.last_warning,
            "last_success_age_s": None if self.last_success is None else round(now - self.last_success, 3),
            "parses": self.parses,
            "parse_skips": self.parse_skips,
            "parse_us_avg": round(self.parse_seconds / max(1, self.parses) * 1e6, 1),
            "process_cpu_s": round(time.process_time() - self._started_cpu, 4),
            "uptime_s": round(now - self._started, 3),
            "models": self.models,
            "metrics": None if self.last_metrics is None else self.last_metrics.to_json(),
        }


ReportEntry = tuple[str, Metrics | None, str | None, int, int]  # pod, metrics, error, consecutive, total


class ReportRound:
    """Counts the scrapes under way that may still report (see `PodScraper.scrape_once`)."""

    def __init__(self) -> None:
        self.busy = 0
        self._quiet: asyncio.Event | None = None

    def begin(self) -> None:
        self.busy += 1

    def end(self) -> None:
        self.busy -= 1
        if self.busy == 0 and self._quiet is not None:
            self._quiet.set()

    async def wait_quiet(self, max_wait_s: float) -> None:
        """Until no scrape is under way, or max_wait_s."""
        if self.busy <= 0 or max_wait_s <= 0:
            return
        self._quiet = quiet = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max_wait_s):
                await quiet.wait()
        self._quiet = None


class ReportBatcher(ReportRound):
    """Coalesces the reports of several scrapers into one `send(entries)` call.

    The scrapers of a process tick together (`after_scrape`) and tell the batcher when a scrape
    begins and when it has queued its report or decided it has none (`ReportRound`): a call goes out
    as soon as every scrape of the round is through, or `max_wait_s` after the first report, with
    every report queued by then; reports queued while a call is in flight go in the next one (one
    call in flight at a time). `report()` queues at once and returns a future that completes when
    the call that carried the entry has returned, or raises what that call raised, so each scraper
    keeps its own rules for what to say again after a lost report."""

    def __init__(self, send: Callable[[list[ReportEntry]], Awaitable[Any]], max_wait_s: float) -> None:
        super().__init__()
        self._send = send
        self.max_wait_s = max_wait_s
        self._pending: list[tuple[ReportEntry, asyncio.Future[None]]] = []
        self._task: asyncio.Task | None = None
        self.calls = 0
        self.entries = 0

    def report(self, entry: ReportEntry) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._pending.append((entry, future))
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._flush())
        return future

    async def _flush(self) -> None:
        await self.wait_quiet(self.max_wait_s)
        while self._pending:
            batch, self._pending = self._pending, []
            self.calls += 1
            self.entries += len(batch)
            try:
                await self._send([entry for entry, _ in batch])
            except asyncio.CancelledError:
                for _, future in batch:
                    future.cancel()
                raise
            except Exception as err:
                for _, future in batch:
                    if not future.done():
                        future.set_exception(err)
            else:
                for _, future in batch:
                    if not future.done():
                        future.set_result(None)

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        for _, future in self._pending:
            future.cancel()
        self._pending = []


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
            lambda m, e, c, t: self._batcher.report((name, m, e, c, t)),
            lambda models: self._report_models(name, models),
            registry=self._registry,
            round_tracker=self._batcher,
        )
        self._scrapers[name] = scraper
        scraper.start()

    async def _send(self, entries: list[ReportEntry]) -> None:
        try:
            async with asyncio.timeout(max(2.0, self._options.scrape_timeout_s)):
                await self._datastore.report_batch.remote(entries)
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

    async def _report_models(self, name: str, models: list[str]) -> None:
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
        for scraper in self._scrapers.values():
            scraper.resync()

    async def stats(self, pod: str | None = None) -> dict[str, Any]:
        """One pod's scrape stats, or (no pod) the totals of this actor."""
        if pod is not None:
            return {**self._pick(pod)[0].stats(), "group": self._group}
        per_pod = [s.stats() for s in self._scrapers.values()]
        parses = sum(s.parses for s in self._scrapers.values())
        parse_s = sum(s.parse_seconds for s in self._scrapers.values())
        totals = {k: sum(p[k] for p in per_pod) for k in ("scrapes", "failures", "reports", "report_errors")}
        return {
            "group": self._group,
            "pid": os.getpid(),
            "pods": sorted(self._scrapers),
            **totals,
            "report_calls": self._batcher.calls,
            "parses": parses,
            "parse_skips": sum(s.parse_skips for s in self._scrapers.values()),
            "parse_us_avg": round(parse_s / max(1, parses) * 1e6, 1),
            "process_cpu_s": round(time.process_time() - self._started_cpu, 4),
            "uptime_s": round(time.monotonic() - self._started, 3),
        }
