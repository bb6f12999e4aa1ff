"""vLLM's Prometheus metrics for one simulated pod, in its own CollectorRegistry.

Gauges and counters are read from the engine when scraped (a custom collector: nothing to update on
the hot path); latency histograms are observed when a request finishes. Names, labels and bucket
boundaries follow vLLM V1 (`model_name` and `engine` labels; the `*_info` gauges carry their data
in labels). Latencies are in the engine's model seconds (unaffected by --time-scale).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ray_epp.simulator.engine import Engine, EngineRequest

TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip

LABELS = ["model_name", "engine"]


class _EngineCollector(Collector):
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.lora_info_time = time.time()
        self._last_lora: tuple[str, str] = ("", "")

    def collect(self) -> Iterator[Metric]:
        e = self.engine
        lv = [e.cfg.model, "0"]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=LABELS)
            g.add_metric(lv, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=LABELS)
            c.add_metric(lv, value)
            return c

        yield gauge("vllm:num_requests_running", "Number of requests in model execution batches.", len(e.running))
        yield gauge(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            len(e.waiting) + len(e.transferring),
        )
        yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", e.kv.usage())
        running = ",".join(e.lora.running_adapters())
        waiting = ",".join(e.waiting_adapters())
        if (running, waiting) != self._last_lora:
            self._last_lora = (running, waiting)
            self.lora_info_time = time.time()
        info = GaugeMetricFamily(
            "vllm:lora_requests_info",
            "Running stats on lora requests.",
            labels=["max_lora", "waiting_lora_adapters", "running_lora_adapters"],
        )
        info.add_metric([str(e.lora.max_loras), waiting, running], self.lora_info_time)
        yield info
        cache = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=["block_size", "num_gpu_blocks", "enable_prefix_caching", "cache_dtype"],
        )
        cache.add_metric([str(e.block_size), str(e.kv.num_blocks), str(e.cfg.enable_prefix_caching), "auto"], 1.0)
        yield cache
        yield counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
            e.prefix_queries,
        )  # fmt: skip
        yield counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", e.prefix_hits
        )
        yield counter("vllm:prompt_tokens", "Number of prefill tokens processed.", e.prompt_tokens_total)
        yield counter("vllm:generation_tokens", "Number of generation tokens processed.", e.generation_tokens_total)
        yield counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", e.preemptions)
        success = CounterMetricFamily(
            "vllm:request_success", "Count of successfully processed requests.", labels=[*LABELS, "finished_reason"]
        )
        for reason, n in sorted(e.finished_by_reason.items()):
            success.add_metric([*lv, reason], n)
        yield success


class PodMetrics:
    """The registry of one pod and the histograms the HTTP driver observes."""

    def __init__(self, engine: Engine) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_EngineCollector(engine))
        lv = (engine.cfg.model, "0")

        def histogram(name: str, doc: str, buckets: Sequence[float]) -> Any:
            return Histogram(name, doc, LABELS, registry=self.registry, buckets=buckets).labels(*lv)

        self.ttft = histogram(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", LATENCY_BUCKETS
        )
        self.queue = histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            LATENCY_BUCKETS,
        )
        self.itl = histogram(
            "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS
        )

    def observe(self, r: EngineRequest) -> None:
        """Record a finished request's latencies (one ITL sample per request: its mean)."""
        if r.first_token_time >= 0:
            self.ttft.observe(r.first_token_time - r.arrival)
        self.e2e.observe(r.finish_time - r.arrival)
        if r.first_scheduled >= 0:
            self.queue.observe(r.first_scheduled - r.arrival)
        if r.num_output > 1:
            self.itl.observe((r.finish_time - r.first_token_time) / (r.num_output - 1))

    def render(self) -> bytes:
        return generate_latest(self.registry)
