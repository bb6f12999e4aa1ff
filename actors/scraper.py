"""One pod's scrape loop in plain asyncio: GET its Prometheus `/metrics` every tick, map the page to
`Metrics` with the pod's engine preset, and report what the rules of `actors/scrape_rules.py` say
is worth reporting through an injected callback (so the benchmark and the tests run it without
Ray; `NodeMetricsActor` runs one per pod). It also follows the pod's served models (`/v1/models`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

import aiohttp
from ray.exceptions import ActorDiedError

from actors.http_get import MAX_BODY_BYTES, HttpError, KeepAliveGet, too_large
from actors.options import ActorOptions, PodSpec
from actors.report_batcher import ReportRound
from actors.scrape_report import EXTRACT_ERROR_PREFIX
from actors.scrape_rules import ReportPolicy, after_scrape
from scheduler import Metrics, ServedModel
from scheduler.engine_metrics import DEFAULT_REGISTRY, EngineRegistry, parse_metrics

log = logging.getLogger("ray_epp.actors.scraper")

# Called with (metrics, error, consecutive failures, total failures); returns what to await. It
# should queue the report before it returns (ReportBatcher.report does), not when awaited.
ReportFn = Callable[[Metrics | None, str | None, int, int], Awaitable[None]]
ModelsFn = Callable[[list[ServedModel]], Awaitable[None]]


def served_models(payload: Any) -> list[ServedModel]:
    """The entries of an OpenAI `/v1/models` answer (base models, and LoRA adapters with their
    `parent`), one per id, sorted by id; entries without a string id are skipped."""
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, list):
        raise ValueError("no 'data' list in the /v1/models answer")
    by_id: dict[str, ServedModel] = {}
    for entry in data:
        if isinstance(entry, dict) and isinstance(entry.get("id"), str) and entry["id"]:
            by_id.setdefault(entry["id"], ServedModel.from_json(entry))
    return [by_id[k] for k in sorted(by_id)]


def model_ids(payload: Any) -> list[str]:
    """Model ids of an OpenAI `/v1/models` answer (base models and LoRA adapters)."""
    return [m.id for m in served_models(payload)]


@dataclass(slots=True)
class ScrapeCounters:
    """What a scraper has done since it was created (for stats; `consecutive_failures` and
    `failures` also travel in its reports)."""

    scrapes: int = 0
    failures: int = 0
    consecutive_failures: int = 0
    reports: int = 0
    report_errors: int = 0
    parses: int = 0
    parse_skips: int = 0
    parse_seconds: float = 0.0


class PodScraper:
    """Scrapes one pod in a loop, on the ticks of `after_scrape`, and reports as `ReportPolicy`
    says. An unchanged page is not parsed again."""

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
        self.options = options
        if registry is None:
            registry = EngineRegistry.from_params(options.metrics_extractor) if options.metrics_extractor else None
        self.engine = (registry or DEFAULT_REGISTRY).for_labels(spec.labels)
        self.url = spec.base_url + options.metrics_path
        self.models_url = spec.base_url + options.models_path
        self.counters = ScrapeCounters()
        self._report = report
        self._report_models = report_models
        self._round = round_tracker
        self._round_open = False
        self._policy = ReportPolicy(
            options.heartbeat_s, options.min_report_interval_s, options.unhealthy_after_failures
        )
        # the HTTP clients
        self._session: aiohttp.ClientSession | None = None
        self._fast = options.http_client == "fast"
        self._metrics_conn = KeepAliveGet(spec.address, spec.port, options.scrape_timeout_s)
        self._models_conn = KeepAliveGet(spec.address, spec.port, max(options.scrape_timeout_s, 5.0))
        self._task: asyncio.Task | None = None
        self._models_task: asyncio.Task | None = None
        self._started_cpu = time.process_time()
        self._started = time.monotonic()
        # what the pod said last
        self.last_metrics: Metrics | None = None
        self.last_success: float | None = None
        self.last_error: str | None = None
        self.last_warning: str | None = None
        self.models: list[ServedModel] | None = None
        self._reported_models: list[ServedModel] | None = None
        self._models_wanted = asyncio.Event()  # re-send the served models now, not at the next refresh
        # the last page and what it parsed to (an idle server serves the same page again)
        self._last_body: bytes | None = None
        self._last_parsed: tuple[Metrics | None, str | None] | None = None

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
        self._policy.lost()
        self._reported_models = None
        self._models_wanted.set()

    # --- the loop ------------------------------------------------------------------------------

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
        self.counters.scrapes += 1
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
        counters = self.counters
        if error is None:
            assert metrics is not None
            metrics.update_time = time.time()
            self.last_metrics = metrics
            self.last_success = now
            counters.consecutive_failures = 0
            if self._policy.success_due(metrics, now):
                await self._send(metrics, None, now)
            return
        counters.failures += 1
        counters.consecutive_failures += 1
        self.last_error = error
        if self._policy.failure_due(counters.consecutive_failures, now):
            await self._send(None, error, now)

    def _session_or_new(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.options.scrape_timeout_s),
                connector=aiohttp.TCPConnector(limit=2, ttl_dns_cache=300),
            )
        return self._session

    async def _get(self, conn: KeepAliveGet, url: str, path: str) -> tuple[int, bytes]:
        """(status, body) with the configured client; raises HttpError."""
        if self._fast:
            return await conn.get(path)
        try:
            async with self._session_or_new().get(url) as resp:
                if (resp.content_length or 0) > MAX_BODY_BYTES:
                    raise HttpError(too_large(MAX_BODY_BYTES))
                body = bytearray()
                async for chunk in resp.content.iter_chunked(1 << 20):
                    body += chunk
                    if len(body) > MAX_BODY_BYTES:
                        raise HttpError(too_large(MAX_BODY_BYTES))
                return resp.status, bytes(body)
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
        counters = self.counters
        if body == self._last_body and self._last_parsed is not None:
            # the same page as last time (an idle server): the same outcome, without parsing it again
            counters.parse_skips += 1
            metrics, error = self._last_parsed
            return (None if metrics is None else replace(metrics)), error
        start = time.perf_counter()
        result = parse_metrics(body.decode("utf-8", "replace"), self.engine, self.last_metrics)
        counters.parse_seconds += time.perf_counter() - start
        counters.parses += 1
        self.last_warning = "; ".join(result.warnings) if result.warnings else None
        if result.ok:
            outcome: tuple[Metrics | None, str | None] = (result.metrics, None)
        else:
            outcome = None, f"{EXTRACT_ERROR_PREFIX}{self.url} (engine {self.engine.name}): {result.error}"
        self._last_body, self._last_parsed = body, (None if outcome[0] is None else replace(outcome[0]), outcome[1])
        return outcome

    async def _send(self, metrics: Metrics | None, error: str | None, now: float) -> None:
        counters = self.counters
        try:
            sent = self._report(metrics, error, counters.consecutive_failures, counters.failures)  # queued (batcher)
            self._close_round()
            await sent
        except asyncio.CancelledError:
            raise
        except Exception as err:
            counters.report_errors += 1
            self._policy.lost()
            if isinstance(err, ActorDiedError):
                raise
            log.debug("report of %s failed: %s", self.spec.name, err)
            return
        counters.reports += 1
        self._policy.sent(metrics, now)

    # --- served models -------------------------------------------------------------------------

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
            wait = self.options.models_refresh_s if ok else min(1.0, self.options.models_refresh_s)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._models_wanted.wait()
            self._models_wanted.clear()

    async def _fetch_models(self) -> bool:
        try:
            status, body = await self._get(self._models_conn, self.models_url, self.options.models_path)
            if status != 200:
                return False
            self.models = served_models(json.loads(body))
            return True
        except (HttpError, ValueError):
            return False

    def stats(self) -> dict[str, Any]:
        now = time.monotonic()
        counters = self.counters
        return {
            "pod": self.spec.name,
            "pid": os.getpid(),
            "url": self.url,
            "engine": self.engine.name,
            "running": self.running,
            **{k: v for k, v in asdict(counters).items() if k != "parse_seconds"},
            "last_error": self.last_error,
            "last_warning": self.last_warning,
            "last_success_age_s": None if self.last_success is None else round(now - self.last_success, 3),
            "parse_us_avg": round(counters.parse_seconds / max(1, counters.parses) * 1e6, 1),
            "process_cpu_s": round(time.process_time() - self._started_cpu, 4),
            "uptime_s": round(now - self._started, 3),
            "models": None if self.models is None else [m.id for m in self.models],
            "metrics": None if self.last_metrics is None else self.last_metrics.to_json(),
        }
