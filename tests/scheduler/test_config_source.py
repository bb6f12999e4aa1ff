"""A config is named, a path or YAML text, the same at every front door (scheduler/config/source.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler import ConfigError, load_config_file
from scheduler.config.source import config_source, is_config_text, shipped_config_names

ROOT = Path(__file__).resolve().parents[2]
GIE_DEFAULT = ROOT / "ray_epp" / "configs" / "gie-default.yaml"
GIE_DEFAULT_TEXT = GIE_DEFAULT.read_text()


def test_every_shipped_config_has_a_name():
    assert shipped_config_names() == sorted(p.stem for p in (ROOT / "ray_epp" / "configs").glob("*.yaml"))
    assert {"default", "gie-default", "pd", "lora"} <= set(shipped_config_names())


@pytest.mark.parametrize(
    ("spec", "origin"),
    [
        ("gie-default", "shipped config 'gie-default'"),
        (GIE_DEFAULT_TEXT, "YAML text"),
        (str(GIE_DEFAULT), str(GIE_DEFAULT)),
        (GIE_DEFAULT, str(GIE_DEFAULT)),
    ],
    ids=["name", "text", "absolute path", "Path"],
)
def test_the_three_forms_read_the_same_config(spec, origin):
    text, where = config_source(spec)
    assert text == GIE_DEFAULT_TEXT
    assert where == origin


def test_a_relative_path_is_relative_to_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "mine.yaml").write_text(GIE_DEFAULT_TEXT)
    monkeypatch.chdir(tmp_path)
    assert config_source("mine.yaml") == (GIE_DEFAULT_TEXT, str(tmp_path / "mine.yaml"))


def test_a_file_named_like_a_shipped_config_needs_a_path_to_win(tmp_path, monkeypatch):
    """A bare name is the shipped config; ./name reads the local file."""
    (tmp_path / "default").write_text(GIE_DEFAULT_TEXT)
    monkeypatch.chdir(tmp_path)
    assert config_source("default")[1] == "shipped config 'default'"
    assert config_source("./default")[0] == GIE_DEFAULT_TEXT


def test_an_unknown_name_lists_the_shipped_ones_and_the_path_tried(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as info:
        load_config_file("defualt")
    message = str(info.value)
    assert f"no file at '{tmp_path / 'defualt'}'" in message
    assert "default, gie-default" in message


def test_one_line_json_is_text():
    assert is_config_text('{"apiVersion": "inference.networking.x-k8s.io/v1alpha1"}')
    assert not is_config_text("configs/default.yaml")
