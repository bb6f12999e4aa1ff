"""Prometheus metrics that stay correct with several gateway replicas and profile actors.

Each process records into a cheap local `MetricsRecorder` (dict increments on the hot path) and
pushes its whole cumulative state to the named `MetricsHub` actor every second. Whole state, not
deltas: a lost or repeated push changes nothing. The hub sums the sources and renders Prometheus
text with GIE's metric names."""

from __future__ import annotations

import asyncio
import bisect
import contextlib
from typing import Any

import ray
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

HUB_NAME = "epp-metrics-hub"

LATENCY_BUCKETS = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
REQUEST_BUCKETS = (
    0.005,
    0.025,
    0.05,
    0.1,
    0.2,
    0.4,
    0.6,
    0.8,
    1.0,
    1.25,
    1.5,
    2,
    3,
    4,
    5,
    6,
    8,
    10,
    15,
    20,
    30,
    45,
    60,
    120,
    180,
    240,
    300,
    360,
    480,
    600,
    900,
    1200,
    1800,
    2700,
    3600,
)

QUEUE_BUCKETS = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

# name -> (kind, help, label names, buckets)
METRICS: dict[str, tuple[str, str, tuple[str, ...], tuple[float, ...]]] = {
    "inference_extension_scheduler_e2e_duration_seconds": (
        "histogram",
        "End-to-end scheduling latency distribution in seconds.",
        (),
        LATENCY_BUCKETS,
    ),
    "inference_extension_scheduler_attempts_total": (
        "counter",
        "Total number of scheduling attempts.",
        ("status", "target_model_name"),
        (),
    ),
    "inference_extension_plugin_duration_seconds": (
        "histogram",
        "Plugin processing latency distribution in seconds for each extension point, plugin type and plugin name.",
        ("extension_point", "plugin_type", "plugin_name"),
        LATENCY_BUCKETS,
    ),
    "inference_objective_request_total": (
        "counter",
        "Counter of inference objective requests broken out for each model and target model.",
        ("model_name", "target_model_name", "priority"),
        (),
    ),
    "inference_objective_request_error_total": (
        "counter",
        "Counter of inference objective requests errors broken out for each model and target model.",
        ("model_name", "target_model_name", "error_code"),
        (),
    ),
    "inference_objective_request_duration_seconds": (
        "histogram",
        "Inference objective response latency distribution in seconds for each model and target model.",
        ("model_name", "target_model_name"),
        REQUEST_BUCKETS,
    ),
    "inference_objective_request_ttft_seconds": (
        "histogram",
        "Inference objective time to first token distribution in seconds (as the gateway saw it).",
        ("model_name", "target_model_name"),
        REQUEST_BUCKETS,
    ),
    "inference_objective_running_requests": (
        "gauge",
        "Inference objective number of running requests in each model.",
        ("model_name",),
        (),
    ),
    # Flow control (GIE's names and labels, pkg/epp/metrics in llm-d-router): requests and bytes
    # waiting now, and how long each waited until its outcome (Dispatched, EvictedTTL, ...).
    "inference_extension_flow_control_queue_size": (
        "gauge",
        "Current number of requests actively held in the Flow Control queue.",
        ("fairness_id", "priority", "inference_pool", "model_name", "target_model_name"),
        (),
    ),
    "inference_extension_flow_control_queue_bytes": (
        "gauge",
        "Current total size in bytes of requests actively held in the Flow Control queue.",
        ("fairness_id", "priority", "inference_pool", "model_name", "target_model_name"),
        (),
    ),
    "inference_extension_flow_control_request_queue_duration_seconds": (
        "histogram",
        "Distribution of total time requests spend in the Flow Control layer (from enqueue to final outcome).",
        ("fairness_id", "priority", "outcome", "inference_pool", "model_name", "target_model_name"),
        QUEUE_BUCKETS,
    ),
    # program-aware-fairness's gauges (llm-d's names, pkg/epp/framework/plugins/flowcontrol/
    # fairness/program-aware): the answering gateway replica's policy, read at render time.
    "llm_d_epp_program_aware_jains_fairness_index": (
        "gauge",
        "Jain's fairness index over average wait time across active programs.",
        (),
        (),
    ),
    "llm_d_epp_program_aware_avg_wait_time_milliseconds": (
        "gauge",
        "Cumulative mean of flow-control queue wait time per program in milliseconds.",
        ("program_id",),
        (),
    ),
    "llm_d_epp_program_aware_attained_service_tokens": (
        "gauge",
        "Time-decayed attained service (weighted tokens consumed) per program.",
        ("program_id",),
        (),
    ),
    "disagg_decision_total": ("counter", "Prefill/decode disaggregation decisions.", ("decision",), ()),
    "disagg_prefill_failure_total": ("counter", "Prefill calls that failed, by what happened next.", ("outcome",), ()),
}


class MetricsRecorder:
    """Local, lock-free accumulation; `state()` is the cumulative snapshot that is pushed."""

    __slots__ = ("_counters", "_gauges", "_histograms")

    def __init__(self) -> None:
        self._counters: dict[tuple[str, tuple[str, ...]], float] = {}
        self._gauges: dict[tuple[str, tuple[str, ...]], float] = {}
        self._histograms: dict[tuple[str, tuple[str, ...]], list[float]] = {}

    def inc(self, name: str, labels: tuple[str, ...] = (), amount: float = 1.0) -> None:
        key = (name, labels)
        self._counters[key] = self._counters.get(key, 0.0) + amount

    def add_gauge(self, name: str, labels: tuple[str, ...] = (), amount: float = 1.0) -> None:
        key = (name, labels)
        self._gauges[key] = self._gauges.get(key, 0.0) + amount

    def observe(self, name: str, value: float, labels: tuple[str, ...] = ()) -> None:
        key = (name, labels)
        counts = self._histograms.get(key)
        buckets = METRICS[name][3]
        if counts is None:
            counts = self._histograms[key] = [0.0] * (len(buckets) + 2)  # buckets..., +Inf, sum
        counts[bisect.bisect_left(buckets, value)] += 1
        counts[-1] += value

    def plugin_timer(self, extension_point: str, plugin: Any, seconds: float) -> None:
        """A scheduler.PluginTimer."""
        self.observe(
            "inference_extension_plugin_duration_seconds", seconds, (extension_point, plugin.type_name, plugin.name)
        )

    def state(self) -> dict[str, dict]:
        return {
            "counters": dict(self._counters),
            "gauges": dict(self._gauges),
            "histograms": {k: list(v) for k, v in self._histograms.items()},
        }


def render(states: list[dict[str, dict]], extra_gauges: dict[str, list[tuple[tuple[str, ...], float]]]) -> bytes:
    """Prometheus text of the sum over sources, plus gauges computed at render time."""
    counters: dict[tuple[str, tuple[str, ...]], float] = {}
    gauges: dict[tuple[str, tuple[str, ...]], float] = {}
    hists: dict[tuple[str, tuple[str, ...]], list[float]] = {}
    for st in states:
        for k, v in st["counters"].items():
            counters[k] = counters.get(k, 0.0) + v
        for k, v in st["gauges"].items():
            gauges[k] = gauges.get(k, 0.0) + v
        for k, v in st["histograms"].items():
            acc = hists.setdefault(k, [0.0] * len(v))
            for i, x in enumerate(v):
                acc[i] += x

    class _Collector:
        def collect(self):
            for name, (kind, help_text, label_names, buckets) in METRICS.items():
                if kind == "counter":
                    fam = CounterMetricFamily(name.removesuffix("_total"), help_text, labels=label_names)
                    for (n, labels), v in counters.items():
                        if n == name:
                            fam.add_metric(list(labels), v)
                elif kind == "gauge":
                    fam = GaugeMetricFamily(name, help_text, labels=label_names)
                    for (n, labels), v in gauges.items():
                        if n == name:
                            fam.add_metric(list(labels), v)
                else:
                    fam = HistogramMetricFamily(name, help_text, labels=label_names)
                    for (n, labels), counts in hists.items():
                        if n == name:
                            cumulative, running = [], 0.0
                            for bound, c in zip([*map(str, buckets), "+Inf"], counts[:-1], strict=True):
                                running += c
                                cumulative.append((bound, running))
                            fam.add_metric(list(labels), cumulative, counts[-1])
                yield fam
            for name, samples in extra_gauges.items():
                label_names = ("name",) if samples and len(samples[0][0]) == 1 else ()
                fam = GaugeMetricFamily(name, name.replace("_", " "), labels=label_names)
                for labels, v in samples:
                    fam.add_metric(list(labels), v)
                yield fam

    registry = CollectorRegistry()
    registry.register(_Collector())
    return generate_latest(registry)


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)
class MetricsHub:
    """Holds each source's latest cumulative state; sources push, /metrics renders."""

    def __init__(self) -> None:
        self._states: dict[str, dict[str, dict]] = {}

    def push(self, source: str, state: dict[str, dict]) -> None:
        self._states[source] = state

    def states(self) -> list[dict[str, dict]]:
        return list(self._states.values())

    def sizes(self) -> dict[str, int]:
        """Sources held and series across them (bench/soak.py watches both stay bounded)."""
        series = sum(len(kind) for st in self._states.values() for kind in st.values())
        return {"sources": len(self._states), "series": series}


def get_or_create_hub(namespace: str | None = None) -> Any:
    """The named hub; detached, so it does not die with whichever process created it first."""
    return MetricsHub.options(name=HUB_NAME, namespace=namespace, get_if_exists=True, lifetime="detached").remote()


def stop_hub(namespace: str | None = None) -> None:
    with contextlib.suppress(Exception):
        ray.kill(ray.get_actor(HUB_NAME, namespace=namespace), no_restart=True)


class MetricsPusher:
    """Pushes a recorder's state to the hub every `interval_s` from the running event loop."""

    def __init__(self, recorder: MetricsRecorder, source: str, hub: Any, interval_s: float = 1.0) -> None:
        self.recorder, self.source, self.hub, self.interval_s = recorder, source, hub, interval_s
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def push_now(self) -> None:
        await self.hub.push.remote(self.source, self.recorder.state())

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            with contextlib.suppress(Exception):  # the hub restarting: the next push restores it
                await self.push_now()
