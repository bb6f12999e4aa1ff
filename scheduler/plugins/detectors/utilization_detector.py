"""`utilization-detector`: GIE's utilization saturation detector, as a filter and for admission.

Per endpoint (a "roofline": the most constrained resource decides):

    score = max(waiting_queue / queueDepthThreshold, kv_usage / kvCacheUtilThreshold)

and an endpoint whose metrics are stale scores 1.0.

* Admission: `saturation(endpoints)` is the average score (1.0 for no endpoints: fail closed);
  `is_pool_saturated(endpoints)` is `saturation >= 1.0`, GIE's test for rejecting a sheddable
  request (priority < 0) with ResourceExhausted / 429.
* Filter: keeps endpoints that are fresh and under the limits relaxed by `headroom`:
  queue < queueDepthThreshold * (1 + headroom) and kv < min(1, kvCacheUtilThreshold * (1 + headroom)).
  If that would remove every endpoint it returns them all (GIE's fail-open), so the scorers can
  pick the least bad one. (GIE's README caps the KV limit at 1.0; its code does not; the cap is
  taken here so a full KV cache is never a candidate.)

Freshness: `Metrics.update_time` is the Unix time (time.time()) of the last successful scrape. An
endpoint is stale when now - update_time > metricsStalenessThreshold (GIE: 200ms). An
update_time of 0 means freshness is *not tracked* (endpoints given as JSON to `epp pick` and
tests carry no scrape time): such an endpoint is judged on its queue and KV cache alone. Whatever
scrapes metrics must therefore set update_time on every scrape; a pod that was never scraped
should not be offered as a candidate at all."""

from __future__ import annotations

from typing import Annotated

from pydantic import BeforeValidator, Field

from scheduler.cycle_state import CycleState
from scheduler.duration import duration_seconds
from scheduler.interfaces import Filter, Parameters, PluginHandle, SaturationDetector
from scheduler.registry import register
from scheduler.types import Endpoint, LLMRequest, Metrics

Seconds = Annotated[float, BeforeValidator(duration_seconds)]


class UtilizationDetectorParameters(Parameters):
    queue_depth_threshold: int = Field(default=5, alias="queueDepthThreshold", gt=0)
    kv_cache_util_threshold: float = Field(default=0.8, alias="kvCacheUtilThreshold", gt=0.0, le=1.0)
    # A Go duration string in config ("200ms"); seconds once loaded.
    metrics_staleness_threshold: Seconds = Field(default=0.2, alias="metricsStalenessThreshold", gt=0.0)
    headroom: float = Field(default=0.0, ge=0.0)


@register
class UtilizationDetector(Filter, SaturationDetector):
    type_name = "utilization-detector"
    Parameters = UtilizationDetectorParameters

    def setup(self, handle: PluginHandle) -> None:
        self.clock = handle.wall_clock  # Unix seconds, the clock update_time is written in
        p = self.params
        self._staleness = p.metrics_staleness_threshold
        self._queue_limit = p.queue_depth_threshold * (1.0 + p.headroom)
        self._kv_limit = min(1.0, p.kv_cache_util_threshold * (1.0 + p.headroom))

    def is_stale(self, metrics: Metrics, now: float) -> bool:
        """Older than the staleness threshold; update_time 0 means freshness is not tracked."""
        return metrics.update_time > 0.0 and now - metrics.update_time > self._staleness

    def endpoint_score(self, endpoint: Endpoint, now: float | None = None) -> float:
        """The endpoint's saturation: 1.0 when stale, else the larger of its queue and KV ratios."""
        m = endpoint.metrics
        if self.is_stale(m, self.clock() if now is None else now):
            return 1.0
        p = self.params
        return max(m.waiting_queue_size / p.queue_depth_threshold, m.kv_cache_usage_percent / p.kv_cache_util_threshold)

    def saturation(self, endpoints: list[Endpoint], now: float | None = None) -> float:
        """The pool's saturation: the average endpoint score, 1.0 (saturated) for no endpoints."""
        if not endpoints:
            return 1.0
        now = self.clock() if now is None else now
        return sum(self.endpoint_score(ep, now) for ep in endpoints) / len(endpoints)

    def is_pool_saturated(self, endpoints: list[Endpoint], now: float | None = None) -> bool:
        """GIE's admission test: sheddable requests are rejected (429) while this is true."""
        return self.saturation(endpoints, now) >= 1.0

    def has_room(self, endpoint: Endpoint, now: float) -> bool:
        """Fresh and under both limits relaxed by headroom: what the filter keeps."""
        m = endpoint.metrics
        return (
            not self.is_stale(m, now)
            and m.waiting_queue_size < self._queue_limit
            and m.kv_cache_usage_percent < self._kv_limit
        )

    def filter(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        now = self.clock()
        kept = [ep for ep in endpoints if self.has_room(ep, now)]
        return kept or endpoints
