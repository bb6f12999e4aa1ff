"""`endpoint-notification-source` (llm-d's pkg/epp/framework/plugins/datalayer/source/notifications):
tells its extractors when an endpoint joins or leaves the pool. Its one extractor in llm-d's
samples is `precise-prefix-cache-producer`, which then subscribes to that pod's KV events or drops
them. Ray EPP's profile actors do exactly that for every KVEventSink plugin, following the pods
through the datastore (actors/kv_event_feeds.py), so the wiring is what runs here; an extractor
that is not a KVEventSink is refused in `dataLayer.sources` (scheduler/config/sections.py)."""

from __future__ import annotations

from scheduler.interfaces import Plugin
from scheduler.registry import register


@register
class EndpointNotificationSource(Plugin):
    type_name = "endpoint-notification-source"
