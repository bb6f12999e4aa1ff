"""`least-kv-cache-filter`: keep the endpoints in the lowest band of KV-cache usage (GIE legacy)."""

from __future__ import annotations

from scheduler.plugins.filters.least_bucket import LeastBucketFilter
from scheduler.registry import register
from scheduler.types import Endpoint


@register
class LeastKVCacheFilter(LeastBucketFilter):
    """Keeps endpoints with min <= kv <= min + (max - min) / len(endpoints)."""

    type_name = "least-kv-cache-filter"

    @staticmethod
    def metric(endpoint: Endpoint) -> float:
        return endpoint.metrics.kv_cache_usage_percent
