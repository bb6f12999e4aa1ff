"""Pods files and gateway settings over hostile documents (deep nesting, not UTF-8, noise): a
PodsFileError / ValueError naming the file and the problem, or a value that is what was asked for;
nothing else escapes."""

from __future__ import annotations

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from actors.launcher import PodsFileError, load_pods_file, parse_pods
from serve_app.gateway.settings import GatewaySettings, load_settings_file
from tests.fuzz.strategies import DEEP, FUZZ, PODS_DOCUMENTS, SETTINGS_DOCUMENTS, dumps, nested

pytestmark = pytest.mark.timeout(120)
# The loaders refuse a file nesting more than 200 brackets deep before PyYAML sees it (PyYAML took
# up to ~14 s at load 37 to give up on 5,000 levels), so files keep FUZZ's 2 s deadline.
FILES = settings(FUZZ, max_examples=50)

FILE_NOISE = st.one_of(
    st.binary(max_size=120),
    st.sampled_from([b"[" * 5000 + b"]" * 5000, b"- " * 3000 + b"x", b"{a: " * 2000 + b"1" + b"}" * 2000,
                     b"a: &a [*a]\npods: *a", b"\xff\xfe\x00", b"pods:\n  - name: [unclosed\n"]),
    DEEP.map(dumps),
)


@FUZZ
@given(PODS_DOCUMENTS)
def test_parse_pods_gives_pods_or_pods_file_error(data):
    try:
        pods = parse_pods(data)
    except PodsFileError as err:
        assert str(err).startswith("pods: ")
        return
    assert len({p.name for p in pods}) == len(pods)
    assert all(1 <= p.port <= 65535 and p.base_url.startswith("http://") for p in pods)


@FILES
@given(st.one_of(PODS_DOCUMENTS.map(dumps), FILE_NOISE), st.sampled_from(["pods.yaml", "pods.json"]))
def test_pods_files_load_or_raise_pods_file_error(tmp_path_factory, text, name):
    path = tmp_path_factory.mktemp("pods") / name
    path.write_bytes(text)
    try:
        load_pods_file(path)
    except PodsFileError as err:
        assert str(path) in str(err)


@FUZZ
@given(SETTINGS_DOCUMENTS)
def test_settings_validate_or_raise_validation_error(data):
    try:
        settings_ = GatewaySettings.model_validate(data)
    except ValidationError:
        return
    assert settings_.max_json_depth >= 2 and settings_.max_body_bytes > 0


def settings_text(data) -> bytes:
    try:
        return yaml.safe_dump(data).encode()
    except RecursionError:
        return dumps(data)


@FILES
@given(st.one_of(SETTINGS_DOCUMENTS.map(settings_text), FILE_NOISE))
def test_settings_files_load_or_raise_value_error(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("settings") / "settings.yaml"
    path.write_bytes(text)
    try:
        load_settings_file(path)
    except ValueError as err:
        assert str(path) in str(err)


def test_pods_file_not_utf8_is_a_pods_file_error(tmp_path):
    (tmp_path / "pods.yaml").write_bytes(b"- name: \x80\n")
    with pytest.raises(PodsFileError, match=r"pods\.yaml.*not UTF-8"):
        load_pods_file(tmp_path / "pods.yaml")


def test_settings_file_not_utf8_is_a_value_error_naming_the_file(tmp_path):
    (tmp_path / "settings.yaml").write_bytes(b"api_key: \x80\n")
    with pytest.raises(ValueError, match=r"settings\.yaml.*not UTF-8"):
        load_settings_file(tmp_path / "settings.yaml")


@pytest.mark.parametrize("name", ["pods.yaml", "pods.json"])
@pytest.mark.parametrize("depth", [990, 50_000])
def test_deep_pods_file_is_a_pods_file_error(tmp_path, name, depth):
    (tmp_path / name).write_bytes(dumps(nested(depth)))
    with pytest.raises(PodsFileError, match=name):
        load_pods_file(tmp_path / name)


@pytest.mark.parametrize("depth", [990, 50_000])
def test_deep_settings_file_is_a_value_error(tmp_path, depth):
    (tmp_path / "settings.yaml").write_bytes(dumps({"objectives": nested(depth, "dict")}))
    with pytest.raises(ValueError, match=r"settings\.yaml"):
        load_settings_file(tmp_path / "settings.yaml")
