"""The config loader over hostile documents: `load_config` gives a config that builds and
schedules, or raises ConfigError; nothing else escapes, nothing hangs. `epp validate` on the same
kind of files exits 0 or 1 with a message, never a traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler import (
    ConfigError,
    Endpoint,
    LLMRequest,
    Metrics,
    Scheduler,
    SchedulingError,
    load_config,
    load_config_file,
)
from tests.fuzz.strategies import FUZZ, JSON_VALUES, config_documents, dumps, nested

pytestmark = pytest.mark.timeout(120)

ENDPOINTS = [
    Endpoint(name="pod-a", port=8001, labels={"llm-d.ai/role": "decode"},
             metrics=Metrics(waiting_queue_size=1, kv_cache_usage_percent=0.2, active_models={"lora-1": 1})),
    Endpoint(name="pod-b", port=8002, labels={"llm-d.ai/role": "prefill"},
             metrics=Metrics(running_requests_size=3, kv_cache_usage_percent=0.7)),
]


def request() -> LLMRequest:
    return LLMRequest(request_id="r1", target_model="m", body={"model": "m", "prompt": "hello " * 40}, headers={})


def to_yaml(doc) -> str:
    """YAML text for a document; JSON text (also YAML) for one too deep for the YAML writer."""
    try:
        return yaml.safe_dump(doc)
    except RecursionError:
        return dumps(doc).decode()


def check_loads_builds_schedules(source) -> None:
    try:
        cfg = load_config(source)
    except ConfigError as err:
        assert str(err).strip()
        return
    scheduler = Scheduler.from_config(cfg)
    try:
        result = scheduler.schedule(request(), [Endpoint(name=e.name, port=e.port, labels=dict(e.labels),
                                                         metrics=e.metrics) for e in ENDPOINTS])
    except SchedulingError:
        return
    assert result.profile_results


@FUZZ
@given(config_documents())
def test_config_documents_load_or_raise_config_error(doc):
    check_loads_builds_schedules(doc)


@FUZZ
@given(config_documents())
def test_config_yaml_text_loads_or_raises_config_error(doc):
    check_loads_builds_schedules(to_yaml(doc))


YAML_NOISE = st.one_of(
    st.text(max_size=200),
    st.sampled_from([
        "plugins: [", "{{{{", "- - - -", "plugins: !!python/object:os.system ls", "&a [*a]",
        "a: &a [*a, *a]\nb: &b [*a, *a, *a, *a]\nc: &c [*b, *b, *b, *b]\nd: &d [*c, *c, *c, *c]\nplugins: *d",
        "plugins:\n- type: max-score-picker\n  parameters: {maxNumOfEndpoints: 1e400}",
        "plugins:\n- type: max-score-picker\n  parameters: {maxNumOfEndpoints: 99999999999999999999999}",
        "plugins:\n- type: prefix-cache-scorer\n  parameters: {lruCapacityPerServer: 1000000000000}",
        "plugins:\n- type: prefix-cache-scorer\n  parameters: {blockSize: -1}",
        "\t\x00\x01", "\ufeffplugins: []", "plugins: " + "[" * 5000 + "]" * 5000,
        "plugins: " + "{a: " * 2000 + "1" + "}" * 2000,
    ]),
    JSON_VALUES.map(lambda v: dumps(v).decode()),
)


@FUZZ
@given(YAML_NOISE)
def test_random_yaml_text_loads_or_raises_config_error(text):
    check_loads_builds_schedules(text)


@pytest.mark.parametrize("depth", [100, 1_000, 20_000])
def test_deep_parameters_are_a_config_error(depth):
    doc = {"plugins": [{"type": "max-score-picker", "parameters": {"maxNumOfEndpoints": nested(depth)}}]}
    with pytest.raises(ConfigError):
        load_config(doc)


@settings(FUZZ, max_examples=8, deadline=None)
@given(st.one_of(config_documents().map(to_yaml), YAML_NOISE))
def test_epp_validate_exits_cleanly(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("validate") / "config.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    proc = subprocess.run([sys.executable, "-m", "serve_app.cli", "validate", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode in (0, 1), proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    if proc.returncode == 0:
        assert "EndpointPickerConfig" in proc.stdout
    else:
        assert proc.stderr.strip()


@settings(FUZZ, max_examples=100)
@given(st.binary(max_size=100))
def test_config_files_of_any_bytes_load_or_raise_config_error(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("bytes") / "config.yaml"
    path.write_bytes(data)
    try:
        load_config_file(path)
    except ConfigError as err:
        assert str(err).strip()


def test_epp_validate_on_a_file_that_is_not_utf8(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_bytes(b"plugins:\n- type: \x80\xff\n")
    proc = subprocess.run([sys.executable, "-m", "serve_app.cli", "validate", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "not UTF-8" in proc.stderr and "Traceback" not in proc.stderr
