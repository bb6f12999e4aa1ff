"""The replica side of `EPPRequestRouter`: what an LLM replica publishes through Serve's
`record_routing_stats`, and how the router reads it back into the scheduler's `Metrics`.

Serve calls a deployment's `record_routing_stats()` every `request_routing_stats_period_s` and hands
the dict to every router of that deployment with the replica set (`RunningReplica.routing_stats`).
The engine state travels under one key, `ENGINE_STATS_KEY`, so other routers' stats can sit beside
it. The fields are the model-server metrics GIE scrapes from vLLM (`vllm:num_requests_waiting`,
`vllm:num_requests_running`, `vllm:kv_cache_usage_perc`, `vllm:lora_requests_info`,
`vllm:cache_config_info`): a replica states them directly instead of being scraped.

Two ways to publish: `engine_routing_stats(...)`, a plain function any deployment's own
`record_routing_stats` can return; or `EngineStatsMixin`, which counts the requests the replica runs
(`track_request`) and publishes those counts, unless the class overrides `engine_state()` with its
engine's real figures. No Ray import: a replica imports this cheaply."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from scheduler import Metrics

ENGINE_STATS_KEY = "epp_engine"
# In a replica's `record_replica_metadata`: where its engine's Prometheus page is, for a router that
# scrapes it (a replica with Serve's direct ingress needs none: its HTTP endpoint is known).
METRICS_URL_KEY = "epp.metrics_url"


def engine_routing_stats(
    *,
    waiting: int = 0,
    running: int = 0,
    kv_cache_usage: float = 0.0,
    running_lora_adapters: Iterable[str] = (),
    waiting_lora_adapters: Iterable[str] = (),
    max_lora: int = 0,
    block_size: int = 0,
    num_blocks: int = 0,
    labels: dict[str, str] | None = None,
    engine_queue: bool = True,
) -> dict[str, Any]:
    """The routing-stats dict for a replica's engine state: return it from `record_routing_stats`
    (or merge it into the dict you already return). `kv_cache_usage` is a fraction (0..1);
    `labels` are endpoint labels for label filters (e.g. `{"llm-d.ai/role": "decode"}`);
    `engine_queue`: `waiting` is the engine's own queue, admitted in arrival order, so the router
    may infer from it which requests had their first token (serve_app/llm_router/first_token.py)."""
    return {
        ENGINE_STATS_KEY: {
            "waiting": int(waiting),
            "running": int(running),
            "kv_cache_usage": float(kv_cache_usage),
            "running_lora_adapters": sorted(set(running_lora_adapters)),
            "waiting_lora_adapters": sorted(set(waiting_lora_adapters)),
            "max_lora": int(max_lora),
            "block_size": int(block_size),
            "num_blocks": int(num_blocks),
            "labels": dict(labels or {}),
            "engine_queue": bool(engine_queue),
            "time": time.time(),
        }
    }


def metrics_from_stats(stats: dict[str, Any] | None) -> tuple[Metrics, dict[str, str]] | None:
    """The scheduler's view of a replica's published engine state, and the labels it declared;
    None when the replica publishes none (or garbage, which must not fail routing)."""
    engine = (stats or {}).get(ENGINE_STATS_KEY)
    if not isinstance(engine, dict):
        return None
    try:
        metrics = Metrics(
            waiting_queue_size=int(engine.get("waiting", 0)),
            running_requests_size=int(engine.get("running", 0)),
            kv_cache_usage_percent=float(engine.get("kv_cache_usage", 0.0)),
            active_models={str(m): 0 for m in engine.get("running_lora_adapters") or ()},
            waiting_models={str(m): 0 for m in engine.get("waiting_lora_adapters") or ()},
            max_active_models=int(engine.get("max_lora", 0)),
            cache_block_size=int(engine.get("block_size", 0)),
            cache_num_blocks=int(engine.get("num_blocks", 0)),
        )
        labels = {str(k): str(v) for k, v in (engine.get("labels") or {}).items()}
    except (TypeError, ValueError, AttributeError):
        return None
    return metrics, labels


def published_queue(stats: dict[str, Any] | None) -> tuple[int, float] | None:
    """(waiting, when taken) of a replica that publishes its engine's own queue; else None."""
    engine = (stats or {}).get(ENGINE_STATS_KEY)
    if not isinstance(engine, dict) or engine.get("engine_queue") is not True:
        return None
    try:
        return int(engine.get("waiting", 0)), float(engine.get("time", 0.0))
    except (TypeError, ValueError):
        return None


class EngineStatsMixin:
    """Mix into a Serve deployment class to publish its engine state to `EPPRequestRouter`.

    By default it publishes counts of the requests the replica is serving: wrap each request in
    `with self.track_request(lora_id):` (running = requests inside, waiting = those beyond
    `epp_max_running`). A class that knows its engine's figures overrides `engine_state()` and
    returns `engine_routing_stats(...)`."""

    epp_max_running: int = 0  # 0: no limit, nothing counts as waiting
    epp_max_lora: int = 0
    epp_block_size: int = 0
    epp_labels: dict[str, str] = {}

    def _epp_counts(self) -> Counter[str]:
        counts = getattr(self, "_epp_in_flight", None)
        if counts is None:
            counts = Counter()
            self._epp_in_flight = counts
        return counts

    @contextmanager
    def track_request(self, lora_id: str = "") -> Iterator[None]:
        counts = self._epp_counts()
        counts[lora_id] += 1
        try:
            yield
        finally:
            counts[lora_id] -= 1
            if counts[lora_id] <= 0:
                del counts[lora_id]

    def engine_state(self) -> dict[str, Any]:
        counts = self._epp_counts()
        total = sum(counts.values())
        limit = self.epp_max_running
        running = min(total, limit) if limit else total
        return engine_routing_stats(
            waiting=total - running,
            running=running,
            running_lora_adapters=[m for m in counts if m],
            max_lora=self.epp_max_lora,
            block_size=self.epp_block_size,
            labels=self.epp_labels,
            engine_queue=bool(limit),  # a count of tracked requests is an engine queue only with a limit
        )

    def record_routing_stats(self) -> dict[str, Any]:
        """Called by Serve every `request_routing_stats_period_s`."""
        return self.engine_state()
