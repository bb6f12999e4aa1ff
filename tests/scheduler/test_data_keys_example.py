"""The worked example of docs/DESIGN.md ("Producers and typed data keys"), run as the document
writes it: a new producer and a new scorer reading its key, registered and loaded from a config.
A change to the contract that breaks the example fails here."""

from __future__ import annotations

import re
import types
from pathlib import Path

import pytest

from scheduler import ConfigError, Scheduler, load_config
from tests.scheduler.helpers import endpoint, request

DESIGN = Path(__file__).resolve().parents[2] / "docs" / "DESIGN.md"
BLOCK = re.compile(r"<!-- data-keys-example:start -->\n```python\n(.*?)```\n<!-- data-keys-example:end -->", re.S)


@pytest.fixture(scope="module")
def example() -> types.ModuleType:
    """The document's code, executed once as a module (its plugins register by type name)."""
    found = BLOCK.search(DESIGN.read_text())
    assert found, "docs/DESIGN.md lost its data-keys example block"
    module = types.ModuleType("design_data_keys_example")
    exec(compile(found.group(1), str(DESIGN), "exec"), module.__dict__)
    return module


CONFIG = {
    "plugins": [{"type": "prompt-length-producer"}, {"type": "long-prompt-queue-scorer"}],
    "schedulingProfiles": [{"name": "default", "plugins": [{"pluginRef": "long-prompt-queue-scorer"}]}],
}


def test_the_profile_runs_the_producer_and_the_scorer_reads_its_key(example):
    sched = Scheduler.from_config(load_config(CONFIG))
    (producer,) = sched.profiles["default"].producers
    assert isinstance(producer, example.PromptLengthProducer)
    eps = [endpoint("busy", waiting_queue_size=9), endpoint("idle", waiting_queue_size=0)]
    for i in range(10):  # a scorer that read nothing would tie them: a coin toss each time
        result = sched.schedule(request(prompt="long " * 1000, request_id=f"r{i}"), eps)
        assert result.target.name == "idle"


def test_a_config_without_the_producer_fails_naming_the_consumer_and_the_key(example):
    cfg = {**CONFIG, "plugins": [{"type": "long-prompt-queue-scorer"}]}
    with pytest.raises(ConfigError) as err:
        load_config(cfg)
    assert "plugin 'long-prompt-queue-scorer' (type long-prompt-queue-scorer)" in str(err.value)
    assert "'prompt-chars/prompt-length-producer'" in str(err.value)
