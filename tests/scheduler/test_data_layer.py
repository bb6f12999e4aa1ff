"""llm-d's data layer where Ray EPP's actors are it: a `metrics-data-source` with
`core-metrics-extractor` (the metrics actors' scrape and mapping, their parameters passed on as
actor options) and an `endpoint-notification-source` feeding KV-event sinks (the profile actors'
KV-event feeds) load; everything they can not be is refused, naming the field and why."""

from __future__ import annotations

import pytest

from scheduler.config import load_config
from scheduler.config.report import config_report
from scheduler.config.sections import data_layer_actor_options
from scheduler.errors import ConfigError

PLUGINS = """
plugins:
- type: metrics-data-source
  parameters: {params}
- type: core-metrics-extractor
  parameters: {extractor}
- type: endpoint-notification-source
- type: precise-prefix-cache-producer
- type: prefix-cache-scorer
  parameters: {{prefixMatchInfoProducerName: precise-prefix-cache-producer}}
- type: queue-scorer
"""
SOURCES = """
dataLayer:
  sources:
  - pluginRef: metrics-data-source
    extractors: [{{pluginRef: {metrics_extractor}}}]
  - pluginRef: endpoint-notification-source
    extractors: [{{pluginRef: {notified}}}]
"""


def config(params: str = "{}", extractor: str = "{}", metrics_extractor: str = "core-metrics-extractor",
           notified: str = "precise-prefix-cache-producer") -> str:  # fmt: skip
    return PLUGINS.format(params=params, extractor=extractor) + SOURCES.format(
        metrics_extractor=metrics_extractor, notified=notified)  # fmt: skip


def test_the_sources_ray_epp_runs_load_and_set_the_actor_options():
    engine = "{defaultEngine: sglang, engineConfigs: [{name: mine, queuedRequestsSpec: q, runningRequestsSpec: r}]}"
    cfg = load_config(config("{path: /stats, interval: 200ms}", engine))
    assert data_layer_actor_options(cfg) == {
        "metrics_path": "/stats",
        "refresh_interval_s": 0.2,
        "metrics_extractor": {
            "defaultEngine": "sglang",
            "engineConfigs": [{"name": "mine", "queuedRequestsSpec": "q", "runningRequestsSpec": "r"}],
        },
    }
    lines = {line.where: line for line in config_report(config()).lines}
    assert lines["dataLayer.sources[0] 'metrics-data-source'"].status == "accepted"
    assert "precise-prefix-cache-producer" in lines["dataLayer.sources[1] 'endpoint-notification-source'"].why
    assert data_layer_actor_options(load_config(config())) == {"metrics_path": "/metrics"}  # the defaults


@pytest.mark.parametrize(
    ("kwargs", "expect"),
    [
        ({"params": "{scheme: https}"}, "plain http only"),
        ({"params": "{port: 9000}"}, "port override is not implemented"),
        ({"params": "{caCertPath: /ca.pem}"}, "TLS files"),
        ({"params": "{interval: 0s}"}, "positive duration"),
        ({"params": "{path: metrics}"}, "must start with '/'"),
        ({"extractor": "{engineConfigs: [{name: default}]}"}, "reserved"),
        ({"metrics_extractor": "queue-scorer"}, "extractor 'queue-scorer': a metrics source's extractor here is"),
        ({"notified": "queue-scorer"}, "endpoint notifications reach KV-event sinks here"),
        ({"notified": "nobody"}, "pluginRef 'nobody' names no plugin"),
    ],
)
def test_what_the_actors_can_not_be_is_refused(kwargs, expect):
    with pytest.raises(ConfigError, match=expect):
        load_config(config(**kwargs))


def test_a_second_metrics_source_is_refused():
    text = config() + "  - pluginRef: metrics-data-source\n"
    with pytest.raises(ConfigError, match="a second metrics source"):
        load_config(text)
