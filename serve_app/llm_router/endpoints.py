"""The scheduler's endpoint from a Ray Serve `RunningReplica`, and the cache that keeps it per
replica info: what `EPPRequestRouter` hands the scheduler for each candidate replica.

An endpoint is named by the replica id, labelled from the replica's metadata, node and zone, and
carries the metrics its `record_routing_stats` publishes (serve_app/llm_router/stats.py), else its
engine's scraped `/metrics` page (serve_app/llm_router/scrapers.py), else Serve's queue-length cache; its
multiplexed model ids are resident LoRA adapters. Serve replaces a replica's info (metadata,
routing stats, multiplexed ids) when it changes, so what is read from that info is kept until it
does: a replica that publishes its engine state is converted once per stats update, not once per
request. Scraped metrics and Serve's queue lengths change between requests and are read every time."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ray.serve.request_router import ReplicaID, RunningReplica

from scheduler import Endpoint, Metrics
from serve_app.llm_router.scrapers import ReplicaScrapers
from serve_app.llm_router.stats import metrics_from_stats

NODE_LABEL = "ray.io/node-id"
ZONE_LABEL = "topology.kubernetes.io/zone"
REPLICA_LABEL = "ray.io/serve-replica-id"
# Serve's handles reach a replica by actor, not by address; an Endpoint needs one all the same.
UNKNOWN_ADDRESS, UNKNOWN_PORT = "127.0.0.1", 8000


@dataclass(slots=True, frozen=True)
class ConvertedReplica:
    """A replica info read once (`ReplicaEndpoints.converted`): `source` is the info's objects it
    was read from; `endpoint` the endpoint to reuse while they stay (None: metrics read per request;
    plugins do not change the endpoints they are given)."""

    source: tuple[Any, ...]
    labels: dict[str, str]
    address: str
    port: int
    endpoint: Endpoint | None


class ReplicaEndpoints:
    """Replica id -> its info as read last (iterating gives the ids held). `changed`: a replica
    came, went or changed its info since the owner last cleared it (the scrapers follow that)."""

    def __init__(self, scrapers: ReplicaScrapers, queue_len: Callable[[ReplicaID], int | None]) -> None:
        self._scrapers = scrapers
        self._queue_len = queue_len  # Serve's count of a replica's ongoing requests (None: unknown)
        self._converted: dict[ReplicaID, ConvertedReplica] = {}
        self.changed = True

    def __iter__(self) -> Iterator[ReplicaID]:
        return iter(self._converted)

    def keep(self, current: set[ReplicaID]) -> None:
        """Forget the replicas not in `current` (they went away)."""
        self._converted = {rid: c for rid, c in self._converted.items() if rid in current}
        self.changed = True

    def endpoint_of(self, replica: RunningReplica) -> Endpoint:
        """The replica as the scheduler's endpoint (the module docstring says what is read when)."""
        rid = replica.replica_id
        cached = self.converted(replica)
        if cached.endpoint is not None:
            return cached.endpoint
        scraped = self._scrapers.scraped(rid.unique_id) if self._scrapers else None
        if scraped is not None:  # its engine's own /metrics page
            metrics = scraped
        else:  # nothing published: Serve's own count of the replica's ongoing requests
            queue_len = self._queue_len(rid) or 0
            metrics = Metrics(waiting_queue_size=queue_len, running_requests_size=queue_len)
        for model_id in replica.multiplexed_model_ids:  # loaded: resident adapters
            metrics.active_models.setdefault(model_id, 0)
        return Endpoint(rid.unique_id, cached.address, cached.port, dict(cached.labels), metrics)

    def converted(self, replica: RunningReplica) -> ConvertedReplica:
        """The replica's info as read last, read again when it changed (`changed` set then)."""
        source = (replica.replica_metadata, replica.routing_stats, frozenset(replica.multiplexed_model_ids),
                  replica.node_id, replica.availability_zone, replica.backend_http_endpoint)  # fmt: skip
        cached = self._converted.get(replica.replica_id)
        if cached is None or cached.source != source:  # the same objects compare equal at once
            cached = self._converted[replica.replica_id] = _convert(replica, source)
            self.changed = True
        return cached


def _convert(replica: RunningReplica, source: tuple[Any, ...]) -> ConvertedReplica:
    """What one replica info says: labels, address, and (when it publishes its engine state) the
    whole endpoint."""
    metadata, stats, model_ids, node_id, zone, host_port = source
    labels = {str(k): str(v) for k, v in metadata.items() if isinstance(v, str | int | float)}
    labels[REPLICA_LABEL] = replica.replica_id.unique_id
    if node_id:
        labels[NODE_LABEL] = node_id
    if zone:
        labels[ZONE_LABEL] = zone
    address, port = host_port if host_port is not None else (UNKNOWN_ADDRESS, UNKNOWN_PORT)
    published = metrics_from_stats(stats)
    if published is None:
        return ConvertedReplica(source, labels, address, port, None)
    metrics, declared = published
    labels.update(declared)
    for model_id in model_ids:  # loaded: resident adapters
        metrics.active_models.setdefault(model_id, 0)
    endpoint = Endpoint(replica.replica_id.unique_id, address, port, labels, metrics)
    return ConvertedReplica(source, labels, address, port, endpoint)
