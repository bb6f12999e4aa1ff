"""When a pod's scraper scrapes, and when a scrape is worth a report: plain rules, no I/O.

Scrapes run on a tick grid shared by every scraper of a process (so one round's reports travel in
one call, `actors/report_batcher.py`). A success is reported when the metrics changed or a
heartbeat is due; failures one by one until the pod would be unhealthy, then once per heartbeat;
anything after a lost report (or a resync) at once."""

from __future__ import annotations

import math
from dataclasses import dataclass

from scheduler import Metrics


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


@dataclass(slots=True)
class ReportPolicy:
    """What the last report of one pod said, and so whether the next scrape must be reported.
    Times are on the monotonic clock."""

    heartbeat_s: float
    min_report_interval_s: float
    unhealthy_after_failures: int
    reported: Metrics | None = None  # None: nothing yet, or the last report was a failure
    reported_at: float = 0.0
    force: bool = True  # say it at the next scrape, whatever it is

    def success_due(self, metrics: Metrics, now: float) -> bool:
        changed = now - self.reported_at >= self.min_report_interval_s and not same_metrics(metrics, self.reported)
        return self.force or changed or self.heartbeat_due(now)

    def failure_due(self, consecutive_failures: int, now: float) -> bool:
        return self.force or consecutive_failures <= self.unhealthy_after_failures or self.heartbeat_due(now)

    def heartbeat_due(self, now: float) -> bool:
        """A heartbeat is due when a multiple of heartbeat_s passed since the last report: at most
        heartbeat_s (plus a scrape interval) apart, and on the same tick for every scraper of a
        process, so their heartbeats share one report call."""
        return math.floor(now / self.heartbeat_s) != math.floor(self.reported_at / self.heartbeat_s)

    def sent(self, metrics: Metrics | None, now: float) -> None:
        """The report got through (after a failure, None: the next success is always reported)."""
        self.reported, self.reported_at, self.force = metrics, now, False

    def lost(self) -> None:
        """The report did not get through: the datastore may not know it, say it again next time."""
        self.force = True
