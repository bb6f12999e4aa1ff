"""Admission: which saturation detectors decide whether a sheddable request is shed, and the test.

The gateway (serve_app.gateway.GatewayCore.admit) and the cluster-simulation router
(bench.policies.epp) both ask here, so the benchmark measures the admission users get.

The detectors are every `SaturationDetector` the config declares, plus GIE's utilization detector
with the given defaults when the config declares none of that type: the scraped-metrics line always
applies, and a ledger detector (e.g. `prefill-backlog-detector`) can only make admission stricter.
The pool is saturated when any detector says so. A config whose `flowControl.saturationDetector`
names a detector (llm-d's field) uses that one alone, as llm-d does.

With the `flowControl` gate on, the same detectors gate the flow-control queue's dispatch
(scheduler/flowcontrol/controller.py) instead of shedding."""

from __future__ import annotations

from collections.abc import Iterable

from scheduler.config.models import EndpointPickerConfig
from scheduler.interfaces import Plugin, SaturationDetector
from scheduler.registry import plugin_class
from scheduler.types import Endpoint

# GIE's utilization detector, found by its type name like any configured plugin: the core imports no plugin.
DEFAULT_DETECTOR = "utilization-detector"


def admission_detectors(
    plugins: Iterable[Plugin], queue_depth: int = 5, kv_cache: float = 0.8, plugin_ref: str = ""
) -> list[SaturationDetector]:
    """The config's detectors, with GIE's utilization detector (queue_depth, kv_cache) added if
    absent; only `plugin_ref`'s when given (flowControl.saturationDetector.pluginRef)."""
    detectors = [p for p in plugins if isinstance(p, SaturationDetector)]
    if plugin_ref:
        chosen = [d for d in detectors if d.name == plugin_ref]
        if not chosen:
            raise LookupError(f"saturation detector {plugin_ref!r} is not among the config's plugins")
        return chosen
    default = plugin_class(DEFAULT_DETECTOR)
    if default is None or not issubclass(default, SaturationDetector):
        raise LookupError(f"plugin type {DEFAULT_DETECTOR!r} is not a registered saturation detector")
    if not any(isinstance(d, default) for d in detectors):
        params = {"queueDepthThreshold": queue_depth, "kvCacheUtilThreshold": kv_cache}
        detectors.insert(0, default(params=default.Parameters.model_validate(params)))
    return detectors


def detector_ref(cfg: EndpointPickerConfig) -> str:
    """The detector `flowControl.saturationDetector.pluginRef` names, or "" (all of them)."""
    fc = cfg.flow_control
    return fc.saturation_detector.plugin_ref if fc is not None and fc.saturation_detector is not None else ""


def pool_saturated(detectors: Iterable[SaturationDetector], endpoints: list[Endpoint]) -> bool:
    return any(d.is_pool_saturated(endpoints) for d in detectors)
