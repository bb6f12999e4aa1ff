"""Pods files: YAML or JSON lists of {name, address, port, labels}; one clear error for a bad one."""

from __future__ import annotations

import pytest

from actors.launcher import PodsFileError, load_pods_file, parse_pods
from actors.options import ActorOptions, PodSpec


def test_yaml_and_json_files(tmp_path):
    yaml_file = tmp_path / "pods.yaml"
    yaml_file.write_text(
        "- name: pod-a\n  address: 10.0.0.5\n  port: 8000\n  labels: {llm-d.ai/role: decode}\n"
        "- {name: pod-b, address: 10.0.0.6, port: 8001}\n"
    )
    pods = load_pods_file(yaml_file)
    assert pods == [
        PodSpec(name="pod-a", address="10.0.0.5", port=8000, labels={"llm-d.ai/role": "decode"}),
        PodSpec(name="pod-b", address="10.0.0.6", port=8001),
    ]
    json_file = tmp_path / "pods.json"
    json_file.write_text('{"pods": [{"name": "pod-a", "address": "10.0.0.5", "port": 8000}]}')
    assert load_pods_file(json_file)[0].base_url == "http://10.0.0.5:8000"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([{"name": "a", "address": "h", "port": 0}], "entry 0 ('a'): port: Input should be greater than or equal to 1"),
        ([{"name": "a", "address": "h"}], "entry 0 ('a'): port: Field required"),
        ([{"name": "a", "address": "h", "port": 1, "label": {}}], "entry 0 ('a'): label: unknown field"),
        ([{"name": "a", "address": "h", "port": 1}, {"name": "a", "address": "h", "port": 2}], "entry 1 ('a'): name"),
        ([{"address": "h", "port": 1}], "entry 0: name: Field required"),
        ([{"name": "a", "address": "h", "port": 1, "labels": {"k": 1}}], "entry 0 ('a'): labels.k: Input should be"),
        (["pod-a"], "entry 0: expected a mapping"),
        ({"name": "a"}, "expected a list of pods"),
    ],
)
def test_bad_entries_name_the_entry_and_field(data, message):
    with pytest.raises(PodsFileError) as err:
        parse_pods(data, where="pods file 'x.yaml'")
    assert message in str(err.value) and str(err.value).startswith("pods file 'x.yaml': ")


def test_unreadable_or_invalid_files(tmp_path):
    with pytest.raises(PodsFileError, match="can not read pods file"):
        load_pods_file(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- name: [unclosed\n")
    with pytest.raises(PodsFileError, match="is not valid YAML"):
        load_pods_file(bad)


def test_actor_options_validate_the_metrics_extractor():
    with pytest.raises(ValueError, match="defaultEngine 'x' not found"):
        ActorOptions(metrics_extractor={"defaultEngine": "x"})
    assert ActorOptions().refresh_interval_s == 0.05 and ActorOptions().staleness_threshold_s == 2.0
