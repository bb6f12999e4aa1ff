"""One actor per model server: scrape its Prometheus `/metrics` every 50 ms, map it to `Metrics`
with the pod's engine preset, and tell the datastore when something changed.

`PodScraper` is the loop in plain asyncio (report callbacks injected, so the benchmark can run it
without Ray); `PodMetricsActor` is the Ray actor around it. The actor starts scraping as soon as it
is constructed, so a restarted actor (max_restarts=-1) resumes without being told to."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import ray
from ray.exceptions import ActorDiedError

from actors.http_get import HttpError, KeepAliveGet
from actors.options import ActorOptions, PodSpec, as_options, as_pod
from scheduler import Metrics
from scheduler.engine_metrics import DEFAULT_REGISTRY, EngineRegistry, parse_metrics

log = logging.getLogger("ray_epp.actors.pod_metrics")

ReportFn = Callable[[Metrics | None, str | None, int, int], Awaitable[None]]
ModelsFn = Callable[[list[str]], Awaitable[None]]


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
    """Scrapes one pod in a loop. Reports a success when the metrics changed or `heartbeat_s` has
    passed since the last report; reports failures one by one until the pod would be unhealthy, then
    once per heartbeat."""

    def __init__(
        self,
        spec: PodSpec,
        options: ActorOptions,
        report: ReportFn,
        report_models: ModelsFn | None = None,
        registry: EngineRegistry | None = None,
    ) -> None:
        self.spec = spec
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
        next_at = time.monotonic()
        while True:
            try:
                await self.scrape_once()
            except asyncio.CancelledError:
                raise
            except ActorDiedError:  # the datastore is gone for good: nobody to report to
                return
            except Exception as err:  # never let the loop die
                log.exception("scrape loop of %s: %s", self.spec.name, err)
            next_at += interval
            now = time.monotonic()
            if next_at < now - interval:  # fell behind (slow pod or report): do not burst
                next_at = now
            await asyncio.sleep(max(0.0, next_at - now))

    async def scrape_once(self) -> None:
        """One scrape, parse and (maybe) report."""
        self.scrapes += 1
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
            if self._force or changed or since >= self.options.heartbeat_s:
                await self._send(metrics, None, now)
            return
        self.failures += 1
        self.consecutive_failures += 1
        self.last_error = error
        if (
            self._force
            or self.consecutive_failures <= self.options.unhealthy_after_failures
            or now - self._reported_at >= self.options.heartbeat_s
        ):
            await self._send(None, error, now)

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
        start = time.perf_counter()
        result = parse_metrics(body.decode("utf-8", "replace"), self.engine, self.last_metrics)
        self.parse_seconds += time.perf_counter() - start
        self.last_warning = "; ".join(result.warnings) if result.warnings else None
        if not result.ok:
            return None, f"bad metrics from {self.url} (engine {self.engine.name}): {result.error}"
        return result.metrics, None

    async def _send(self, metrics: Metrics | None, error: str | None, now: float) -> None:
        try:
            await self._report(metrics, error, self.consecutive_failures, self.failures)
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
            "parse_us_avg": round(self.parse_seconds / max(1, self.scrapes) * 1e6, 1),
            "process_cpu_s": round(time.process_time() - self._started_cpu, 4),
            "uptime_s": round(now - self._started, 3),
            "models": self.models,
            "metrics": None if self.last_metrics is None else self.last_metrics.to_json(),
        }


@ray.remote
class PodMetricsActor:
    """A pod's scraper as a Ray actor. Created by the datastore (detached, named, max_restarts=-1);
    if its datastore is gone for good it kills itself, so no orphan keeps scraping."""

    def __init__(self, spec: dict[str, Any] | PodSpec, datastore: Any, options: dict[str, Any] | None = None) -> None:
        self._spec = as_pod(spec)
        self._datastore = datastore
        self._scraper = PodScraper(self._spec, as_options(options), self._report, self._report_models)
        self._exit_task: asyncio.Task | None = None
        self._scraper.start()

    async def _report(self, metrics: Metrics | None, error: str | None, consecutive: int, total: int) -> None:
        try:
            async with asyncio.timeout(max(2.0, self._scraper.options.scrape_timeout_s)):
                await self._datastore.report.remote(self._spec.name, metrics, error, consecutive, total)
        except ActorDiedError:
            if self._exit_task is None:
                log.warning("the datastore of %s is gone for good: this metrics actor exits", self._spec.name)
                self._exit_task = asyncio.get_running_loop().create_task(self._exit())
            raise

    async def _exit(self) -> None:
        await self._scraper.stop()  # from its own task: the scrape task is the one being cancelled
        ray.kill(ray.get_runtime_context().current_actor, no_restart=True)

    async def _report_models(self, models: list[str]) -> None:
        async with asyncio.timeout(5.0):
            await self._datastore.report_models.remote(self._spec.name, models)

    async def start(self) -> bool:
        return self._scraper.start()

    async def stop(self) -> bool:
        return await self._scraper.stop()

    async def resync(self) -> None:
        self._scraper.resync()

    async def stats(self) -> dict[str, Any]:
        return self._scraper.stats()

    async def pod_spec(self) -> dict[str, Any]:
        return self._spec.model_dump()
