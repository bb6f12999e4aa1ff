"""The sections of an EndpointPickerConfig besides plugins and profiles: what Ray EPP does with each
field llm-d defines (apix/config/v1alpha1/endpointpickerconfig_types.go, pkg/epp/config/loader/
configloader.go at ebab6879), and a refusal naming the field for what it can not do. Nothing is
accepted and then ignored.

`section_statuses` is the one list both the loader (refused fields are ConfigErrors) and
`epp validate` (which prints every line) read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from scheduler.config.flow_control import FEATURE_GATE, FlowControlSpec, parse_feature_gates
from scheduler.config.models import EndpointPickerConfig
from scheduler.config.refused import REFUSED
from scheduler.interfaces import KVEventSink, Plugin, SaturationDetector

# llm-d's feature gates (cmd/epp/runner/runner.go registers these two): None accepts the gate, a
# string is why it is refused.
FEATURE_GATES: dict[str, str | None] = {
    "flowControl": None,
    "haPopulateNonLeaderDatastore": None,
}
GATE_NOTES = {
    "flowControl": "the flow-control queue: while the pool is saturated, requests wait in each gateway "
    "replica's queue (priority bands, fairness between flows, limits, TTL) instead of a 429",
    "haPopulateNonLeaderDatastore": "every gateway replica reads the one datastore actor, so every replica "
    "has the pool, which is what the gate asks of llm-d's non-leader replicas (on by default there too)",
}
METRICS_SOURCE, METRICS_EXTRACTOR = "metrics-data-source", "core-metrics-extractor"
ENDPOINT_NOTIFICATIONS = "endpoint-notification-source"
# Parser plugin types the gateway is: it parses OpenAI completions and chat completions itself.
PARSER_TYPES = frozenset({"openai-parser"})


@dataclass(slots=True, frozen=True)
class SectionStatus:
    field: str  # e.g. "dataLayer.sources"
    accepted: bool
    why: str  # what Ray EPP does with it, or why it can not


def section_statuses(cfg: EndpointPickerConfig, classes: dict[str, type[Plugin]]) -> list[SectionStatus]:
    """One line per section field the config sets, accepted or refused."""
    out: list[SectionStatus] = []
    out += _feature_gates(cfg)
    out += _saturation_detector(cfg, classes)
    out += _flow_control(cfg)
    out += _data_layer(cfg, classes)
    out += _parsers(cfg, classes)
    return out


def check_sections(cfg: EndpointPickerConfig, classes: dict[str, type[Plugin]], errors: list[str]) -> None:
    errors.extend(f"{s.field}: {s.why}" for s in section_statuses(cfg, classes) if not s.accepted)


def _feature_gates(cfg: EndpointPickerConfig) -> list[SectionStatus]:
    out = []
    for i, entry in enumerate(cfg.feature_gates):
        field = f"featureGates[{i}] {entry!r}"
        gate = entry.partition("=")[0].strip()  # "name" or "name=true|false"; the value: flow_control.py
        if gate not in FEATURE_GATES:
            out.append(SectionStatus(field, False, f"unknown feature gate (llm-d has {sorted(FEATURE_GATES)})"))
        elif (why := FEATURE_GATES[gate]) is not None:
            out.append(SectionStatus(field, False, why))
        else:
            out.append(SectionStatus(field, True, GATE_NOTES.get(gate, "accepted")))
    return out


def _saturation_detector(cfg: EndpointPickerConfig, classes: dict[str, type[Plugin]]) -> list[SectionStatus]:
    fc = cfg.flow_control
    if fc is not None and fc.saturation_detector is not None:
        field, name = "flowControl.saturationDetector", fc.saturation_detector.plugin_ref
        if not name:
            return [SectionStatus(field, False, "must be {pluginRef: <name of a saturation detector plugin>}")]
    elif cfg.saturation_detector is not None:
        field, name = "saturationDetector", cfg.saturation_detector.plugin_ref
    else:
        return []
    cls = classes.get(name)
    if cls is None:
        return [SectionStatus(field, False, _missing(cfg, name))]
    if not issubclass(cls, SaturationDetector):
        return [SectionStatus(field, False, f"plugin {name!r} (type {cls.type_name}) is not a saturation detector")]
    return [SectionStatus(field, True, f"admission asks only {name!r} whether the pool is saturated (as llm-d)")]


def _flow_control(cfg: EndpointPickerConfig) -> list[SectionStatus]:
    """The queue's settings (scheduler/config/flow_control.py checks their values and policy refs):
    used with the `flowControl` gate; without it ignored with a warning, as llm-d does, and said
    so here. llm-d's in-flight eviction is not implemented: refused."""
    fc = cfg.flow_control
    if fc is None:
        return []
    try:
        enabled = parse_feature_gates(cfg.feature_gates).get(FEATURE_GATE, False)
    except ValueError:
        enabled = False  # the loader reports the bad gate
    out = []
    for name in sorted(fc.model_fields_set - {"saturation_detector"}):
        field = f"flowControl.{FlowControlSpec.model_fields[name].alias or name}"
        if name == "enable_eviction" and fc.enable_eviction:
            out.append(SectionStatus(field, False, "in-flight eviction is not implemented; remove it"))
        elif enabled:
            out.append(SectionStatus(field, True, "used by the flow-control queue"))
        else:
            why = f"ignored: the {FEATURE_GATE!r} feature gate is off (llm-d ignores it too, with a warning)"
            out.append(SectionStatus(field, True, why))
    return out


def _data_layer(cfg: EndpointPickerConfig, classes: dict[str, type[Plugin]]) -> list[SectionStatus]:
    dl = cfg.data_layer
    if dl is None:
        return []
    out = []
    if dl.inject_defaults is True:
        out.append(SectionStatus("dataLayer.injectDefaults", True, "the metrics actors scrape each pod's /metrics"))
    elif dl.inject_defaults is False:
        why = "false can not be honoured: Ray EPP always scrapes each pod's metrics"
        out.append(SectionStatus("dataLayer.injectDefaults", False, why))
    metrics_sources = 0
    for i, source in enumerate(dl.sources):
        field = f"dataLayer.sources[{i}] {source.plugin_ref!r}"
        kind = _type_of(classes, source.plugin_ref)
        metrics_sources += kind == METRICS_SOURCE
        out.append(_source_status(cfg, classes, field, source.plugin_ref, kind,
                                  [e.plugin_ref for e in source.extractors], metrics_sources))  # fmt: skip
    if dl.discovery is not None:
        out.append(SectionStatus("dataLayer.discovery", False, REFUSED["file-discovery"]))
    for key, value in (
        ("peerDiscovery", dl.peer_discovery),
        ("crossReplicaSyncerPluginRef", dl.cross_replica_syncer_plugin_ref),
        ("crossReplicaSyncInterval", dl.cross_replica_sync_interval),
    ):
        if value is not None:
            why = "gateway replicas share the pool and plugin state through actors, not by syncing with peer EPPs"
            out.append(SectionStatus(f"dataLayer.{key}", False, why))
    return out


def _source_status(
    cfg: EndpointPickerConfig, classes: dict[str, type[Plugin]], field: str, ref: str, kind: str | None,
    extractors: list[str], metrics_sources: int,
) -> SectionStatus:  # fmt: skip
    """A source is accepted when Ray EPP's actors are that source with those extractors."""
    if kind is None:
        return SectionStatus(field, False, _missing(cfg, ref))
    bad = next((e for e in extractors if _type_of(classes, e) is None), None)
    if bad is not None:
        return SectionStatus(field, False, f"extractor {_missing(cfg, bad)}")
    if kind == METRICS_SOURCE:
        if metrics_sources > 1:
            return SectionStatus(field, False, "a second metrics source: the metrics actors scrape each pod once")
        wrong = [e for e in extractors if _type_of(classes, e) != METRICS_EXTRACTOR]
        if wrong:
            why = f"extractor {wrong[0]!r}: a metrics source's extractor here is {METRICS_EXTRACTOR!r}"
            return SectionStatus(field, False, why + " (the metrics actors' mapping of engine metrics)")
        mapping = repr(extractors[0]) if extractors else "the default mapping"
        why = f"the metrics actors scrape every pod with its parameters and map the engine metrics with {mapping}"
        return SectionStatus(field, True, why)
    if kind == ENDPOINT_NOTIFICATIONS:
        wrong = [e for e in extractors if not issubclass(classes[e], KVEventSink)]
        if wrong:
            why = f"extractor {wrong[0]!r}: endpoint notifications reach KV-event sinks here"
            return SectionStatus(field, False, why + " (the profile actors follow each pod's events), nothing else")
        sinks = ", ".join(map(repr, extractors)) or "every KV-event sink"
        why = f"the profile actors subscribe to each pod's KV events for {sinks} as pods join and leave"
        return SectionStatus(field, True, why)
    return SectionStatus(field, False, f"plugin {ref!r} (type {kind}) is not a data source Ray EPP runs")


def _type_of(classes: dict[str, type[Plugin]], name: str) -> str | None:
    cls = classes.get(name)
    return cls.type_name if cls is not None else None


def data_layer_actor_options(cfg: EndpointPickerConfig) -> dict[str, Any]:
    """The ActorOptions fields the config's `metrics-data-source` and `core-metrics-extractor` set
    (metrics_path, refresh_interval_s, metrics_extractor), from their parameters; {} without them.
    The config is a loaded one, so the parameters are valid."""
    from scheduler.registry import plugin_class

    out: dict[str, Any] = {}
    for spec in cfg.plugins:
        if spec.type in (METRICS_SOURCE, METRICS_EXTRACTOR):
            cls = plugin_class(spec.type)
            assert cls is not None
            out.update(cls.actor_options(cls.Parameters.model_validate(spec.parameters or {})))  # type: ignore[attr-defined]
    return out


def _parsers(cfg: EndpointPickerConfig, classes: dict[str, type[Plugin]]) -> list[SectionStatus]:
    if cfg.request_handler is not None and cfg.request_handler.parsers:
        refs = [(f"requestHandler.parsers[{i}]", p.plugin_ref) for i, p in enumerate(cfg.request_handler.parsers)]
    elif cfg.parser is not None:
        refs = [("parser", cfg.parser.plugin_ref)]  # llm-d: the deprecated form, used when parsers is empty
    else:
        return []
    out = []
    for field, name in refs:
        cls = classes.get(name)
        if cls is None:
            out.append(SectionStatus(field, False, _missing(cfg, name)))
        elif cls.type_name not in PARSER_TYPES:
            out.append(SectionStatus(field, False, f"plugin {name!r} (type {cls.type_name}) is not a request parser"))
        else:
            out.append(SectionStatus(field, True, "the gateway parses OpenAI completions and chat completions"))
    return out


def _missing(cfg: EndpointPickerConfig, name: str) -> str:
    spec = cfg.plugin_spec(name)
    if spec is None:
        return f"pluginRef {name!r} names no plugin in 'plugins'"
    return f"pluginRef {name!r} names a plugin of type {spec.type!r}, which can not run here (see its plugins entry)"
