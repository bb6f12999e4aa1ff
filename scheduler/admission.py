"""Admission: which saturation detectors decide whether a sheddable request is shed, and the test.

The gateway (serve_app.gateway.core.GatewayCore.admit) and the cluster-simulation router
(bench.policies.epp) both ask here, so the benchmark measures the admission users get.

The detectors are every `SaturationDetector` the config declares, plus GIE's utilization detector
with the given defaults when the config declares none of that type: the scraped-metrics line always
applies, and a ledger detector (e.g. `prefill-backlog-detector`) can only make admission stricter.
The pool is saturated when any detector says so. A config that names its detector
(flowControl.saturationDetector, or llm-d's deprecated top-level saturationDetector) gets that one
alone, as llm-d's loader wires exactly the named plugin, plus any llm-d Admitter (a detector with
`per_request`, asked for every sheddable request as llm-d's admission plugins are).

With the `flowControl` gate on, the same detectors gate the flow-control queue's dispatch
(scheduler/flowcontrol/controller.py) instead of shedding, through their `saturation` and the
config's usage-limit policy."""

from __future__ import annotations

from collections.abc import Iterable

from scheduler.interfaces import Plugin, PluginHandle, SaturationDetector
from scheduler.registry import plugin_class
from scheduler.types import Endpoint

# GIE's utilization detector, found by its type name like any configured plugin: the core imports no plugin.
DEFAULT_DETECTOR = "utilization-detector"


def admission_detectors(
    plugins: Iterable[Plugin],
    queue_depth: int = 5,
    kv_cache: float = 0.8,
    named: str | None = None,
    handle: PluginHandle | None = None,
) -> list[SaturationDetector]:
    """The config's detectors, with GIE's utilization detector (queue_depth, kv_cache) added if absent;
    only the detector called `named` when the config names one (load_config checked it is one).
    `handle`: the added detector's clocks (those the config's plugins were built with)."""
    detectors = [p for p in plugins if isinstance(p, SaturationDetector)]
    if named is not None:
        chosen = [d for d in detectors if d.name == named]
        if len(chosen) != 1:
            raise LookupError(f"the config names saturation detector {named!r}, which is not one of its plugins")
        return chosen + [d for d in detectors if d.per_request and d.name != named]
    default = plugin_class(DEFAULT_DETECTOR)
    if default is None or not issubclass(default, SaturationDetector):
        raise LookupError(f"plugin type {DEFAULT_DETECTOR!r} is not a registered saturation detector")
    if not any(isinstance(d, default) for d in detectors):
        params = {"queueDepthThreshold": queue_depth, "kvCacheUtilThreshold": kv_cache}
        handle = (handle or PluginHandle()).for_plugin(DEFAULT_DETECTOR)
        detectors.insert(0, default(params=default.Parameters.model_validate(params), handle=handle))
    return detectors


def pool_saturated(detectors: Iterable[SaturationDetector], endpoints: list[Endpoint]) -> bool:
    return any(d.is_pool_saturated(endpoints) for d in detectors)


def pool_saturation(detectors: Iterable[SaturationDetector], endpoints: list[Endpoint]) -> float:
    """The pool's saturation for flow control: the highest any detector reports (so it reaches 1.0
    exactly when `pool_saturated` says yes), 0.0 with no detector."""
    return max((d.saturation(endpoints) for d in detectors), default=0.0)
