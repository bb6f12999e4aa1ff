"""The engine `/metrics` pages of a Serve request router's replicas that publish no engine state:
one scraper per replica (the gateway's `actors/scraper.PodScraper`, with the engine presets), in the
router's loop, started when the replica has a metrics URL and stopped when it goes.

A replica's URL is its metadata's `epp.metrics_url` (`METRICS_URL_KEY`), else its direct-ingress
HTTP endpoint (`RunningReplica.backend_http_endpoint`) + `metrics_path`."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

from ray.serve.request_router import RunningReplica

from actors.options import ActorOptions, PodSpec
from actors.scraper import PodScraper
from scheduler import Metrics
from serve_app.llm_router.stats import METRICS_URL_KEY

log = logging.getLogger("ray_epp.serve.llm_router")


async def _ignore_report(*_: Any) -> None:
    """The router reads its scrapers' last metrics itself; nothing to report anywhere."""


class ReplicaScrapers:
    """Replica name -> its page's scraper (None: a bad URL, not tried again)."""

    def __init__(self, options: ActorOptions) -> None:
        self.options = options
        self._scrapers: dict[str, PodScraper | None] = {}

    def __bool__(self) -> bool:
        return bool(self._scrapers)

    def metrics_url(self, replica: RunningReplica) -> str | None:
        """Where the replica's engine metrics are; None when it has no URL nor HTTP endpoint."""
        url = replica.replica_metadata.get(METRICS_URL_KEY)
        if isinstance(url, str) and url:
            return url
        host_port = replica.backend_http_endpoint
        if host_port is None:
            return None
        host = f"[{host_port[0]}]" if ":" in host_port[0] else host_port[0]
        return f"http://{host}:{host_port[1]}{self.options.metrics_path}"

    def sync(self, current: dict[str, RunningReplica]) -> None:
        """One scraper per replica of `current` that has a metrics URL; the others' stopped (on the
        router's loop)."""
        for name in [n for n in self._scrapers if n not in current]:
            scraper = self._scrapers.pop(name)
            if scraper is not None:
                asyncio.get_running_loop().create_task(scraper.stop())
        for name, replica in current.items():
            if name in self._scrapers or (url := self.metrics_url(replica)) is None:
                continue
            parts = urlsplit(url)
            try:
                spec = PodSpec(name=name, address=parts.hostname or "", port=parts.port or 80,
                               labels={str(k): str(v) for k, v in replica.replica_metadata.items()})  # fmt: skip
            except ValueError as err:
                log.warning("EPPRequestRouter: replica %s has a bad metrics URL %r: %s", name, url, err)
                self._scrapers[name] = None
                continue
            options = self.options.model_copy(update={"metrics_path": parts.path or "/metrics"})
            scraper = PodScraper(spec, options, _ignore_report)
            scraper.start()
            self._scrapers[name] = scraper

    def scraped(self, name: str) -> Metrics | None:
        """A replica's last scraped engine metrics, if fresh (within 10 scrape timeouts)."""
        scraper = self._scrapers.get(name)
        if scraper is None or scraper.last_metrics is None or scraper.last_success is None:
            return None
        if time.monotonic() - scraper.last_success > 10 * self.options.scrape_timeout_s:
            return None
        return replace(scraper.last_metrics)
