"""`least-queue-filter`: keep the endpoints in the lowest band of waiting-queue lengths (GIE legacy)."""

from __future__ import annotations

from scheduler.plugins.filters.least_bucket import LeastBucketFilter
from scheduler.registry import register
from scheduler.types import Endpoint


@register
class LeastQueueFilter(LeastBucketFilter):
    """Keeps endpoints with min <= queue <= min + (max - min) // len(endpoints) (integer division,
    as GIE's Go code divides ints)."""

    type_name = "least-queue-filter"
    integral = True

    @staticmethod
    def metric(endpoint: Endpoint) -> float:
        return endpoint.metrics.waiting_queue_size
