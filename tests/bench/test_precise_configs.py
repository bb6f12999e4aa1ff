"""The precise configs (bench/configs/precise*.yaml) are the default with another prefix source:
the precise figures are read against the default's, so a default that changes and a precise
config that does not would compare two routers, not two indexes. These fail on such drift."""

from __future__ import annotations

from typing import Any

import pytest

from bench.policies import CONFIGS, EXPERIMENTS, SchedulerRouter
from scheduler import dump_config, load_config

PRECISE_PRODUCER = "precise-prefix-cache-producer"
PRECISE_CONFIGS = sorted(EXPERIMENTS.glob("precise*.yaml"))
SOURCE_PARAMETER = "prefixMatchInfoProducerName"  # which producer a plugin reads: the prefix source


def without_prefix_source(path) -> tuple[list[tuple[str, str, Any]], list[tuple[str, list[tuple[str, Any]]]]]:
    """A loaded config's plugins (name, type, parameters) and profiles (plugin, weight), with the
    prefix source taken out: every prefix-cache producer and the parameter naming one."""
    cfg = dump_config(load_config(path.read_text()))
    plugins = sorted(
        (p["name"], p["type"], {k: v for k, v in p.get("parameters", {}).items() if k != SOURCE_PARAMETER})
        for p in cfg["plugins"]
        if not p["type"].endswith("prefix-cache-producer")
    )
    profiles = [
        (prof["name"], [(ref["pluginRef"], ref.get("weight")) for ref in prof["plugins"]])
        for prof in cfg["schedulingProfiles"]
    ]
    return plugins, profiles


def test_there_are_precise_configs_to_check():
    assert {p.stem for p in PRECISE_CONFIGS} >= {"precise", "precise-speculative"}


@pytest.mark.parametrize("path", PRECISE_CONFIGS, ids=lambda p: p.stem)
def test_a_precise_config_is_the_default_but_for_the_prefix_source(path):
    default_plugins, default_profiles = without_prefix_source(CONFIGS / "default.yaml")
    plugins, profiles = without_prefix_source(path)
    assert profiles == default_profiles, f"{path.name}: profiles, plugins or weights differ from default.yaml"
    assert plugins == default_plugins, f"{path.name}: filters or scorers differ from default.yaml"
    producers = [p for p in dump_config(load_config(path.read_text()))["plugins"] if p["type"] == PRECISE_PRODUCER]
    assert len(producers) == 1, f"{path.name}: its prefix source is not one {PRECISE_PRODUCER}"


@pytest.mark.parametrize("path", PRECISE_CONFIGS, ids=lambda p: p.stem)
def test_the_affinity_filter_and_the_prefix_scorer_read_the_precise_match(path):
    plugins = SchedulerRouter(path, seed=0).scheduler.plugins
    assert plugins["prefix-cache-affinity-filter"].match_key.producer == PRECISE_PRODUCER
    assert plugins["prefix-cache-scorer"].match_key.producer == PRECISE_PRODUCER
