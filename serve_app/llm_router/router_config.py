"""What of an EndpointPickerConfig a Serve request router runs, decided when the router is built:
the config read (`read_config`), the parts it can not run refused with the plugin or field and why
(`check_router_config`), and the config's data layer applied to the router's `/metrics`
scrapers (`scrape_options`). Nothing is accepted and then ignored.

Refused in Serve, where the gateway (`epp serve`) runs them:
* KV-event consumers (`precise-prefix-cache-producer`, any `KVEventSink`) and the
  `endpoint-notification-source` that feeds them: a Serve replica is an actor named by its replica
  id that says nowhere where its engine publishes KV events, and the router's profile actors have
  no datastore whose pods they could follow (actors/kv_event_feeds.py), so the precise index would
  never hear from a replica and every replica would be scored by the approximate index.
* `token-producer`: it would tokenize inside `choose_replicas`, on the router's event loop (its
  `vllm` backend's `/tokenize` is a blocking HTTP call per prompt not in its token cache), and only
  the precise producer reads its tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from actors.options import ActorOptions, with_data_layer
from scheduler import EndpointPickerConfig, load_config, load_config_file
from scheduler.config.sections import ENDPOINT_NOTIFICATIONS, METRICS_SOURCE, data_layer_actor_options
from scheduler.config.source import DEFAULT_CONFIG_NAME, config_source, is_config_text, shipped_config_names
from scheduler.interfaces import KVEventSink
from scheduler.registry import plugin_class

ROUTER_SCRAPE_INTERVAL_S = 0.1  # the router's own default: a request reads the page, not a snapshot

KV_EVENTS_WHY = (
    "KV events can not reach a Serve request router: a replica publishes no KV-event endpoint and "
    "the router's profile actors follow no pods, so every replica would be scored by the approximate "
    "index; use prefix-cache-scorer's approximate index (the `default` config) in Serve, or the "
    "gateway (`epp serve`) for precise prefix routing"
)
TOKENS_WHY = (
    "it would tokenize inside choose_replicas on the router's event loop (its vllm backend's "
    "/tokenize is a blocking HTTP call per uncached prompt), and only the precise producer, refused "
    "here too, reads its tokens"
)


class RouterConfigError(ValueError):
    """A config the Serve router refuses: one line per plugin or field, each saying why."""


def read_config(config: str | dict[str, Any] | EndpointPickerConfig | None) -> EndpointPickerConfig:
    """A config from a shipped config's name, a path (relative: to the replica's working directory,
    which is the runtime_env's working_dir when it has one), YAML text, a dict or a config; None:
    the shipped `default`."""
    if config is None:
        config = DEFAULT_CONFIG_NAME
    if isinstance(config, str | Path):
        return load_config_file(config)
    return load_config(config)


def portable_config(config: str) -> str:
    """`request_router_kwargs["config"]` that means the same on every replica: a shipped config's
    name and YAML text as they are, a path read now (relative to this process's working directory)
    and passed on as its YAML text. Raises ConfigError naming the path tried."""
    if is_config_text(config) or config in shipped_config_names():
        return config
    return config_source(config)[0]


def refusals(cfg: EndpointPickerConfig) -> list[str]:
    """What of `cfg` a Serve router can not run, one line each (empty: it runs all of it)."""
    out = []
    for spec in cfg.plugins:
        cls = plugin_class(spec.type)
        if cls is not None and issubclass(cls, KVEventSink):
            out.append(f"plugin {spec.name or spec.type!r} (type {spec.type}): {KV_EVENTS_WHY}")
        elif spec.type == "token-producer":
            out.append(f"plugin {spec.name or spec.type!r} (type token-producer): {TOKENS_WHY}")
    for i, source in enumerate(cfg.data_layer.sources if cfg.data_layer else []):
        spec = cfg.plugin_spec(source.plugin_ref)
        if spec is not None and spec.type == ENDPOINT_NOTIFICATIONS:
            out.append(f"dataLayer.sources[{i}] {source.plugin_ref!r}: it feeds KV-event consumers; {KV_EVENTS_WHY}")
    return out


def check_router_config(cfg: EndpointPickerConfig) -> None:
    """Refuse what the router can not run (RouterConfigError naming each plugin or field)."""
    lines = refusals(cfg)
    if lines:
        raise RouterConfigError("EPPRequestRouter can not run this config:\n  " + "\n  ".join(lines))


def scrape_options(cfg: EndpointPickerConfig, scrape: dict[str, Any] | None, scrape_metrics: bool) -> ActorOptions:
    """The router's scraper options: the router kwarg `scrape` (ActorOptions fields), then the
    config's data layer (`metrics-data-source` path and interval, `core-metrics-extractor` engine
    configs) where `scrape` leaves them; a field both set differently is a RouterConfigError, as
    is a data layer that asks for scraping when `scrape_metrics` is off."""
    layer = data_layer_actor_options(cfg)
    scrapes = any(spec.type == METRICS_SOURCE for spec in cfg.plugins)
    if scrapes and not scrape_metrics:
        raise RouterConfigError(
            f"scrape_metrics=False contradicts the config's {METRICS_SOURCE!r} (it asks for the replicas' "
            "/metrics pages to be scraped); drop one of them"
        )
    try:
        options = with_data_layer(ActorOptions(**(scrape or {})), layer)
    except ValueError as err:
        raise RouterConfigError(f"router kwarg scrape: {err}") from None
    if "refresh_interval_s" not in options.model_fields_set:
        options = options.model_copy(update={"refresh_interval_s": ROUTER_SCRAPE_INTERVAL_S})
    return options
