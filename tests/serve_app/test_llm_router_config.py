"""What of a config EPPRequestRouter runs, decided when Serve builds it (constructor, then
`initialize_state` with the router kwargs): the parts it can not run are refused naming the
plugin or field, and the data layer reaches its scrapers. The router is the real class; no Ray is
needed to build it (the Serve-side refusal and scrape run in tests/serve_app/test_llm_router.py)."""

from __future__ import annotations

from ray.serve._private.common import DeploymentHandleSource, DeploymentID

from serve_app.llm_router.router import EPPRequestRouter, RouterConfigError

TOKENS = """
plugins:
- type: token-producer
  parameters: {modelName: m, vllm: {url: "http://127.0.0.1:18510"}}
- type: prefix-cache-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-scorer
"""
LAYER = """
plugins:
- type: metrics-data-source
  parameters: {path: /engine/metrics, interval: 250ms}
- type: core-metrics-extractor
  parameters: {defaultEngine: sglang}
- type: queue-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
"""


def built(config: str, **kwargs) -> EPPRequestRouter:
    router = EPPRequestRouter(deployment_id=DeploymentID(name="d", app_name="a"),
                              handle_source=DeploymentHandleSource.UNKNOWN)  # fmt: skip
    router.initialize_state(config=config, **kwargs)
    return router


def test_token_producer_is_refused_naming_it():
    refused = built(TOKENS).refused  # kept: each request fails with it (Serve can not take a raise here)
    assert isinstance(refused, RouterConfigError)
    assert "token-producer" in str(refused) and "event loop" in str(refused)
    assert built("ray_epp/configs/default.yaml").refused is None


def test_the_data_layer_sets_the_scrape_options():
    options = built(LAYER)._scrapers.options
    assert (options.metrics_path, options.refresh_interval_s) == ("/engine/metrics", 0.25)
    assert options.metrics_extractor == {"defaultEngine": "sglang"}
    default = built("ray_epp/configs/default.yaml")._scrapers.options  # no data layer: the router's own interval
    assert default.refresh_interval_s == 0.1


def test_a_scrape_kwarg_that_contradicts_the_data_layer_is_refused():
    assert "refresh_interval_s" in str(built(LAYER, scrape={"refresh_interval_s": 1.0}).refused)
    assert "scrape_metrics=False" in str(built(LAYER, scrape_metrics=False).refused)
    assert built(LAYER, scrape={"metrics_path": "/engine/metrics"})._scrapers.options.metrics_path == "/engine/metrics"
