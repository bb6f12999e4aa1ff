"""Pods files and gateway settings over hostile documents: a PodsFileError / ValueError naming the
problem, or a value that is what was asked for; nothing else escapes."""

from __future__ import annotations

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from actors.launcher import PodsFileError, load_pods_file, parse_pods
from serve_app.settings import GatewaySettings, load_settings_file
from tests.fuzz.strategies import DEEP, FUZZ, PODS_DOCUMENTS, SETTINGS_DOCUMENTS, dumps, nested

pytestmark = pytest.mark.timeout(120)

FILE_NOISE = st.one_of(
    st.binary(max_size=120),
    st.sampled_from([b"[" * 5000 + b"]" * 5000, b"- " * 3000 + b"x", b"{a: " * 2000 + b"1" + b"}" * 2000,
                     b"a: &a [*a]\npods: *a", b"\xff\xfe\x00", b"pods:\n  - name: [unclosed\n"]),
    DEEP.map(dumps),
)


def plain(text: bytes) -> bool:
    """UTF-8 and fewer than ~500 nesting marks: the file loaders do not yet turn PyYAML's / json's
    RecursionError, nor a file that is not UTF-8, into their clean error (the xfail tests below)."""
    try:
        text.decode()
    except UnicodeDecodeError:
        return False
    return text.count(b"[") + text.count(b"{") + text.count(b"- ") < 500


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


@settings(FUZZ, max_examples=150)
@given(st.one_of(PODS_DOCUMENTS.map(dumps), FILE_NOISE).filter(plain), st.sampled_from(["pods.yaml", "pods.json"]))
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


@settings(FUZZ, max_examples=150)
@given(st.one_of(SETTINGS_DOCUMENTS.map(settings_text), FILE_NOISE).filter(plain))
def test_settings_files_load_or_raise_value_error(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("settings") / "settings.yaml"
    path.write_bytes(text)
    try:
        load_settings_file(path)
    except ValueError as err:
        assert str(path) in str(err)


@pytest.mark.xfail(raises=UnicodeDecodeError, strict=True, reason="read_text's UnicodeDecodeError escapes the loader")
def test_pods_file_not_utf8_is_a_pods_file_error(tmp_path):
    (tmp_path / "pods.yaml").write_bytes(b"- name: \x80\n")
    with pytest.raises(PodsFileError):
        load_pods_file(tmp_path / "pods.yaml")


def test_settings_file_not_utf8_is_a_value_error_naming_the_file(tmp_path):
    (tmp_path / "settings.yaml").write_bytes(b"api_key: \x80\n")
    with pytest.raises(ValueError) as err:
        load_settings_file(tmp_path / "settings.yaml")
    if "settings.yaml" not in str(err.value):
        pytest.xfail("the UnicodeDecodeError (a ValueError) does not name the file")


DEEP_GAP = "the loader lets PyYAML's / json's RecursionError escape on a file nested ~1,000 deep"


@pytest.mark.xfail(raises=RecursionError, strict=True, reason=DEEP_GAP)
@pytest.mark.parametrize("name", ["pods.yaml", "pods.json"])
def test_deep_pods_file_is_a_pods_file_error(tmp_path, name):
    (tmp_path / name).write_bytes(dumps(nested(50_000)))
    with pytest.raises(PodsFileError):
        load_pods_file(tmp_path / name)


@pytest.mark.xfail(raises=RecursionError, strict=True, reason=DEEP_GAP)
def test_deep_settings_file_is_a_value_error(tmp_path):
    (tmp_path / "settings.yaml").write_bytes(dumps({"objectives": nested(50_000, "dict")}))
    with pytest.raises(ValueError):
        load_settings_file(tmp_path / "settings.yaml")
