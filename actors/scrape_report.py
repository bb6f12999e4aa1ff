"""What a metrics actor tells the datastore about one pod after a scrape."""

from __future__ import annotations

from typing import NamedTuple

from scheduler import Metrics

# How a scrape's error starts when the page came but could not be read as metrics (an extract error,
# in llm-d's words; every other failure is a poll error).
EXTRACT_ERROR_PREFIX = "bad metrics from "


class ScrapeReport(NamedTuple):
    """One pod's scrape outcome: a success (`metrics`, no `error`) or a failure (no `metrics`, the
    `error`), with the metrics actor's own failure counts (it throttles failure reports, so the
    datastore can not count them itself). A tuple, so it pickles small and unpacks like one."""

    pod: str
    metrics: Metrics | None
    error: str | None
    consecutive_failures: int
    total_failures: int
