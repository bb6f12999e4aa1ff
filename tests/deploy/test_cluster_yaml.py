"""cluster.yaml is a config `ray up` accepts: checked the way the cluster launcher checks it before
it calls any cloud (`prepare_config` fills the provider's defaults, `validate_config` applies Ray's
ray-schema.json and its cross-field rules; see ray/autoscaler/_private/commands.py
`_bootstrap_config`), and its `epp up` command line is one `epp` accepts."""

from __future__ import annotations

import argparse
import copy
import shlex
from pathlib import Path

import jsonschema
import pytest
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

from serve_app.cli.up import add_up_arguments

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cluster() -> dict:
    return yaml.safe_load((ROOT / "cluster.yaml").read_text())


def test_ray_accepts_it(cluster):
    prepared = prepare_config(copy.deepcopy(cluster))
    validate_config(prepared)
    assert prepared["head_node_type"] in prepared["available_node_types"]
    workers = prepared["available_node_types"]["ray.worker.default"]
    assert workers["min_workers"] >= 2, "two workers from the start: replicas spread, a node loss is survivable"


def test_ray_rejects_a_broken_copy(cluster):
    """The check can fail: a misspelt top-level field and a head type that is not defined."""
    broken = copy.deepcopy(cluster)
    broken["max_worker"] = broken.pop("max_workers")
    with pytest.raises(jsonschema.ValidationError):
        validate_config(prepare_config(broken))
    broken = copy.deepcopy(cluster)
    broken["head_node_type"] = "ray.head.missing"
    with pytest.raises(ValueError, match="head_node_type"):
        validate_config(prepare_config(broken))


def test_it_installs_this_checkout(cluster):
    mounts = cluster["file_mounts"]
    (remote, local), *_ = mounts.items()
    assert (ROOT / local).resolve() == ROOT, "ray up runs from the repository root and copies it"
    assert any(f"pip install --user {remote}" in c for c in cluster["setup_commands"])


def _epp_up_args(cluster: dict) -> list[str]:
    for command in cluster["head_start_ray_commands"]:
        words = shlex.split(command)
        if "epp" in words and words[words.index("epp") + 1] == "up":
            start = words.index("epp") + 2
            end = next((i for i, w in enumerate(words) if i > start and w in (">", ">>")), len(words))
            return words[start:end]
    raise AssertionError("no `epp up` in head_start_ray_commands")


def test_its_epp_up_command_parses(cluster):
    parser = argparse.ArgumentParser(prog="epp up")
    add_up_arguments(parser)
    args = parser.parse_args(_epp_up_args(cluster))
    assert args.address == "auto"
    assert (ROOT / args.config).is_file()
    assert args.replicas >= 2
    for command in cluster["head_start_ray_commands"] + cluster["worker_start_ray_commands"]:
        if "ray start" in command:
            assert "RAY_SERVE_ENABLE_DIRECT_INGRESS=0" in command, "each replica serves the gateway port itself"
