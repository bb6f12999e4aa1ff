"""The sections of an EndpointPickerConfig besides plugins and profiles: what Ray EPP does with each
field llm-d defines (apix/config/v1alpha1/endpointpickerconfig_types.go, pkg/epp/config/loader/
configloader.go at ebab6879), and a refusal naming the field for what it can not do. Nothing is
accepted and then ignored.

`section_statuses` is the one list both the loader (refused fields are ConfigErrors) and
`epp validate` (which prints every line) read."""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.config.flow_control import FEATURE_GATE, FlowControlSpec, parse_feature_gates
from scheduler.config.models import EndpointPickerConfig
from scheduler.config.refused import REFUSED
from scheduler.interfaces import Plugin, SaturationDetector

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
    out += _data_layer(cfg)
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


def _data_layer(cfg: EndpointPickerConfig) -> list[SectionStatus]:
    dl = cfg.data_layer
    if dl is None:
        return []
    out = []
    if dl.inject_defaults is True:
        out.append(SectionStatus("dataLayer.injectDefaults", True, "the metrics actors scrape each pod's /metrics"))
    elif dl.inject_defaults is False:
        why = "false can not be honoured: Ray EPP always scrapes each pod's metrics"
        out.append(SectionStatus("dataLayer.injectDefaults", False, why))
    for i, source in enumerate(dl.sources):
        field = f"dataLayer.sources[{i}] {source.plugin_ref!r}"
        out.append(SectionStatus(field, False, REFUSED["metrics-data-source"]))
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
