"""GIE's combined prefix plugin, expanded: a `prefix-cache-scorer` given the producer's parameters
(blockSizeTokens, lruCapacityPerServer, ...) and naming no producer becomes two plugins, a
`gie-prefix-cache-producer` with those parameters and the scorer reading it, so the scorer only
scores and the producer is a plugin of its own (built, run and bound to metrics like any other).

A scorer that names no producer and sets none of those parameters reads llm-d's default producer
when the config declares one (`approx-prefix-cache-producer`), and is expanded otherwise (GIE's
defaults). Setting the producer's parameters on a scorer that names a producer is a config error."""

from __future__ import annotations

from pydantic import ValidationError

from scheduler.config.models import EndpointPickerConfig, PluginSpec
from scheduler.registry import plugin_class

SCORER = "prefix-cache-scorer"
DEFAULT_PRODUCER = "approx-prefix-cache-producer"  # llm-d's
COMBINED_PRODUCER = "gie-prefix-cache-producer"
PRODUCER_FIELDS = ("prefixMatchInfoProducerName", "prefix_match_info_producer_name")


def expand_combined_prefix_scorers(cfg: EndpointPickerConfig, errors: list[str]) -> None:
    """Split every combined-form prefix-cache-scorer of `cfg` into a producer and the scorer."""
    names = {spec.name or spec.type for spec in cfg.plugins}
    producer_cls = plugin_class(COMBINED_PRODUCER)
    combined_fields: frozenset[str] = producer_cls.combined_fields  # type: ignore[union-attr]
    for i, spec in list(enumerate(cfg.plugins)):
        if spec.type != SCORER or not isinstance(spec.parameters or {}, dict):
            continue
        params = dict(spec.parameters or {})
        combined = {k: params.pop(k) for k in list(params) if k in combined_fields}
        producer = next((params[k] for k in PRODUCER_FIELDS if params.get(k)), "")
        name = spec.name or spec.type
        if producer:
            if combined:
                errors.append(
                    f"plugins[{i}] {name!r} (type {spec.type}): {', '.join(combined)}: set these on the producer "
                    f"{producer!r}, not on a scorer that reads it"
                )
            continue
        if not combined and DEFAULT_PRODUCER in names:
            continue  # llm-d's form: the default producer
        spec.parameters = params
        try:  # checked here, so a mistake names the plugin the user wrote
            producer_cls.Parameters.model_validate(combined)  # type: ignore[union-attr]
        except ValidationError as err:
            for e in err.errors():
                field = ".".join(["parameters", *(str(p) for p in e["loc"])])
                errors.append(
                    f"plugins[{i}] {name!r} (type {spec.type}): {field}: {e['msg'].removeprefix('Value error, ')}"
                )
            continue
        producer = name + producer_cls.combined_suffix  # type: ignore[union-attr]
        cfg.plugins.append(PluginSpec(name=producer, type=COMBINED_PRODUCER, parameters=combined))
        spec.parameters["prefixMatchInfoProducerName"] = producer
