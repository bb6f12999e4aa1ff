"""Prometheus metrics that stay correct with several gateway replicas and profile actors.

Each process records into a cheap local `MetricsRecorder` (dict increments on the hot path) and
pushes its whole cumulative state to the named `MetricsHub` actor every second. Whole state, not
deltas: a lost or repeated push changes nothing. The hub sums the sources and renders Prometheus
text with GIE's and llm-d's metric names (actors/metric_families/; docs/OBSERVABILITY.md)."""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import time
from collections.abc import Callable
from typing import Any

import ray
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from actors.metric_families import BUCKETS, COUNTER, FAMILIES, GAUGE, Family

HUB_NAME = "epp-metrics-hub"
# A source that has not pushed for this long is gone (a replica or actor that died): its gauges no
# longer count (its in-flight requests are not in flight), its counters and histograms still do.
GAUGE_TTL_S = 10.0

Key = tuple[str, tuple[str, ...]]
# A collector reports values read when the state is taken (an index's size, a subscriber's state),
# for scalar families: (name, labels) -> value.
Collector = Callable[[], dict[Key, float]]


class MetricsRecorder:
    """Local, lock-free accumulation; `state()` is the cumulative snapshot that is pushed. Names
    are families of actors/metric_families/."""

    __slots__ = ("_collectors", "_counters", "_gauges", "_histograms")

    def __init__(self) -> None:
        self._counters: dict[Key, float] = {}
        self._gauges: dict[Key, float] = {}
        self._histograms: dict[Key, list[float]] = {}
        self._collectors: list[Collector] = []

    def inc(self, name: str, labels: tuple[str, ...] = (), amount: float = 1.0) -> None:
        key = (name, labels)
        self._counters[key] = self._counters.get(key, 0.0) + amount

    def add_gauge(self, name: str, labels: tuple[str, ...] = (), amount: float = 1.0) -> None:
        key = (name, labels)
        self._gauges[key] = self._gauges.get(key, 0.0) + amount

    def observe(self, name: str, value: float, labels: tuple[str, ...] = ()) -> None:
        key = (name, labels)
        counts = self._histograms.get(key)
        buckets = BUCKETS[name]
        if counts is None:
            counts = self._histograms[key] = [0.0] * (len(buckets) + 2)  # buckets..., +Inf, sum
        counts[bisect.bisect_left(buckets, value)] += 1
        counts[-1] += value

    def counts(self, name: str, labels: tuple[str, ...] = ()) -> list[float]:
        """A histogram series' own counts (bucket..., +Inf, sum), for a caller that observes it
        often (a stream's chunk gaps): `counts[bisect_left(BUCKETS[name], v)] += 1; counts[-1] += v`."""
        key = (name, labels)
        counts = self._histograms.get(key)
        if counts is None:
            counts = self._histograms[key] = [0.0] * (len(BUCKETS[name]) + 2)
        return counts

    def add_collector(self, collector: Collector) -> None:
        """Also report what `collector` returns each time the state is taken (once per push)."""
        self._collectors.append(collector)

    def plugin_timer(self, extension_point: str, plugin: Any, seconds: float) -> None:
        """A scheduler.PluginTimer."""
        self.observe(
            "inference_extension_plugin_duration_seconds", seconds, (extension_point, plugin.type_name, plugin.name)
        )

    def state(self) -> dict[str, dict]:
        gauges = dict(self._gauges)
        for collect in self._collectors:
            with contextlib.suppress(Exception):  # a broken collector must not stop the push
                gauges.update(collect())
        return {
            "counters": dict(self._counters),
            "gauges": gauges,
            "histograms": {k: list(v) for k, v in self._histograms.items()},
        }


def render(states: list[dict[str, dict]], extra: dict[Key, float] | None = None) -> bytes:
    """Prometheus text of the sum over sources, plus `extra` values computed when the page is read
    (pool gauges, the build, the datastore's counts), of every family in the catalogue: recorded
    ones as summed, views from their sources (actors/metric_families/)."""
    scalars: dict[str, dict[tuple[str, ...], float]] = {}
    hists: dict[str, dict[tuple[str, ...], list[float]]] = {}
    for st in states:
        for part in ("counters", "gauges"):
            for (name, labels), v in st[part].items():
                by = scalars.setdefault(name, {})
                by[labels] = by.get(labels, 0.0) + v
        for (name, labels), v in st["histograms"].items():
            acc = hists.setdefault(name, {}).setdefault(labels, [0.0] * len(v))
            for i, x in enumerate(v):
                acc[i] += x
    for (name, labels), v in (extra or {}).items():
        by = scalars.setdefault(name, {})
        by[labels] = by.get(labels, 0.0) + v

    class _Collector:
        def collect(self):
            for fam in FAMILIES.values():
                if fam.exposed:
                    yield _family(fam, scalars, hists)

    registry = CollectorRegistry()
    registry.register(_Collector())
    return generate_latest(registry)


def _family(fam: Family, scalars: dict, hists: dict) -> Any:
    source = fam.view_of or fam.name
    if fam.kind == COUNTER:
        out = CounterMetricFamily(fam.name.removesuffix("_total"), fam.help, labels=fam.labels)
    elif fam.kind == GAUGE:
        out = GaugeMetricFamily(fam.name, fam.help, labels=fam.labels)
    else:
        out = HistogramMetricFamily(fam.name, fam.help, labels=fam.labels)
        samples = hists.get(source, {})
        if fam.view_of is not None:
            samples = _hist_view(fam, samples)
        for labels, counts in samples.items():
            cumulative, running = [], 0.0
            for bound, c in zip([*map(floatToGoString, fam.buckets), "+Inf"], counts[:-1], strict=True):
                running += c
                cumulative.append((bound, running))
            out.add_metric(list(labels), cumulative, counts[-1])
        return out
    values = scalars.get(source, {})
    if fam.view_of is not None:
        values = _scalar_view(fam, values)
    for labels, v in values.items():
        out.add_metric(list(labels), v)
    return out


def _projection(fam: Family) -> tuple[list[int], list[tuple[int, str]]]:
    src = FAMILIES[fam.view_of]  # type: ignore[index]
    index = {n: i for i, n in enumerate(src.labels)}
    keep = [index[n] for n in (fam.view_labels or fam.labels)]
    where = [(index[n], v) for n, v in fam.where]
    return keep, where


def _scalar_view(fam: Family, values: dict[tuple[str, ...], float]) -> dict[tuple[str, ...], float]:
    keep, where = _projection(fam)
    out: dict[tuple[str, ...], float] = {}
    for labels, v in values.items():
        if all(labels[i] == want for i, want in where):
            key = tuple(labels[i] for i in keep)
            out[key] = out.get(key, 0.0) + v
    return out


def _hist_view(fam: Family, samples: dict[tuple[str, ...], list[float]]) -> dict[tuple[str, ...], list[float]]:
    keep, where = _projection(fam)
    src_buckets = FAMILIES[fam.view_of].buckets  # type: ignore[index]
    # each source bucket (and +Inf) counts into the first of ours whose bound is at least its own
    into = [bisect.bisect_left(fam.buckets, b) for b in src_buckets] + [len(fam.buckets)]
    out: dict[tuple[str, ...], list[float]] = {}
    for labels, counts in samples.items():
        if not all(labels[i] == want for i, want in where):
            continue
        acc = out.setdefault(tuple(labels[i] for i in keep), [0.0] * (len(fam.buckets) + 2))
        for i, c in enumerate(counts[:-1]):
            acc[into[i]] += c
        acc[-1] += counts[-1]
    return out


def live_states(states: dict[str, dict], pushed: dict[str, float], now: float) -> list[dict[str, dict]]:
    """Every source's state; a source silent for GAUGE_TTL_S (monotonic `now`) without its gauges."""
    old = now - GAUGE_TTL_S
    return [st if pushed[src] >= old else {**st, "gauges": {}} for src, st in states.items()]


@ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)
class MetricsHub:
    """Holds each source's latest cumulative state; sources push, /metrics renders."""

    def __init__(self) -> None:
        self._states: dict[str, dict[str, dict]] = {}
        self._pushed: dict[str, float] = {}

    def push(self, source: str, state: dict[str, dict]) -> None:
        self._states[source] = state
        self._pushed[source] = time.monotonic()

    def states(self) -> list[dict[str, dict]]:
        return live_states(self._states, self._pushed, time.monotonic())

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
