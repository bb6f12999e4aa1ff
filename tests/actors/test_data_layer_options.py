"""The config's data layer reaches the metrics actors' options (`with_data_layer`): its metrics
path, interval and engine configs apply where the options leave the defaults, and a contradiction
with an option set on purpose is an error naming the field. No Ray needed."""

from __future__ import annotations

import pytest

from actors.options import ActorOptions, with_data_layer
from scheduler.config import load_config
from scheduler.config.sections import data_layer_actor_options

CONFIG = """
plugins:
- type: metrics-data-source
  parameters: {path: /stats, interval: 100ms}
- type: core-metrics-extractor
  parameters: {defaultEngine: sglang}
- type: queue-scorer
"""


def test_the_data_layer_sets_what_the_options_leave_at_their_defaults():
    layer = data_layer_actor_options(load_config(CONFIG))
    opts = with_data_layer(ActorOptions(datastore_name="d", heartbeat_s=0.5), layer)
    assert (opts.metrics_path, opts.refresh_interval_s) == ("/stats", 0.1)
    assert opts.metrics_extractor == {"defaultEngine": "sglang"}
    assert (opts.datastore_name, opts.heartbeat_s) == ("d", 0.5)  # the rest as given
    same = with_data_layer(ActorOptions(metrics_path="/stats"), layer)  # agreeing twice is fine
    assert same.metrics_path == "/stats"
    untouched = ActorOptions(refresh_interval_s=0.3)
    assert with_data_layer(untouched, {}) is untouched


def test_an_option_that_contradicts_the_data_layer_is_an_error():
    layer = data_layer_actor_options(load_config(CONFIG))
    with pytest.raises(ValueError, match=r"refresh_interval_s=0.3 contradicts the config's data layer \(0.1\)"):
        with_data_layer(ActorOptions(refresh_interval_s=0.3), layer)
