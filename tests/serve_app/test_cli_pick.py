"""`epp pick` and `epp validate` through the real command line (in-process, no Ray)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from serve_app.cli.commands import main

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path, name, data):
    p = tmp_path / name
    p.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return str(p)


def endpoints(*specs):
    return [
        {"name": n, "address": "10.0.0.1", "port": 8000 + i, "labels": labels, "metrics": m}
        for i, (n, labels, m) in enumerate(specs)
    ]


def run_pick(capsys, config, eps, req):
    code = main(["pick", "--config", config, "--endpoints", eps, "--request", req])
    return code, json.loads(capsys.readouterr().out)


def test_pick_default_config_avoids_loaded_pod(tmp_path, capsys):
    eps = write(
        tmp_path,
        "e.json",
        endpoints(
            ("busy", {}, {"waiting_queue_size": 9, "kv_cache_usage_percent": 0.9}),
            ("idle", {}, {"waiting_queue_size": 0, "kv_cache_usage_percent": 0.1}),
        ),
    )
    req = write(tmp_path, "r.json", {"request_id": "r1", "body": {"model": "m", "prompt": "hello"}})
    code, out = run_pick(capsys, str(ROOT / "ray_epp" / "configs" / "default.yaml"), eps, req)
    assert code == 0
    assert out == {"primary_profile": "default", "profiles": {"default": ["idle"]}}


def test_pick_lora_config_prefers_pod_with_adapter(tmp_path, capsys):
    eps = write(
        tmp_path,
        "e.json",
        endpoints(
            ("no-room", {}, {"active_models": ["a", "b"], "max_active_models": 2}),
            ("has-it", {}, {"active_models": ["lora-1"], "max_active_models": 2}),
        ),
    )
    req = write(tmp_path, "r.json", {"target_model": "lora-1", "body": {"model": "lora-1", "prompt": "x"}})
    code, out = run_pick(capsys, str(ROOT / "ray_epp" / "configs" / "lora.yaml"), eps, req)
    assert code == 0
    assert out["profiles"][out["primary_profile"]] == ["has-it"]


def test_pick_shed_with_legacy_tree_prints_429_code(tmp_path, capsys):
    saturated = {"waiting_queue_size": 50, "kv_cache_usage_percent": 0.95}
    eps = write(tmp_path, "e.json", endpoints(("a", {}, saturated), ("b", {}, saturated)))
    req = write(tmp_path, "r.json", {"criticality": "Sheddable", "body": {"model": "m", "prompt": "x"}})
    code, out = run_pick(capsys, str(ROOT / "ray_epp" / "configs" / "legacy-filter-tree.yaml"), eps, req)
    assert code == 1
    assert out["error"]["code"] == "ResourceExhausted"


@pytest.mark.parametrize(
    ("eps_text", "req_text", "fragment"),
    [
        ("not json", '{"body": {"model": "m"}}', "not valid JSON"),
        ('{"name": "x"}', '{"body": {"model": "m"}}', "JSON list"),
        ('[{"address": "x"}]', '{"body": {"model": "m"}}', "needs a 'name'"),
        ('[{"name": "a"}]', '{"body": {"prompt": "p"}}', "names no model"),
        ('[{"name": "a"}]', '{"priority": "high", "body": {"model": "m"}}', "priority must be an integer"),
    ],
)
def test_pick_bad_input_is_a_json_error(tmp_path, capsys, eps_text, req_text, fragment):
    code, out = run_pick(
        capsys,
        str(ROOT / "ray_epp" / "configs" / "default.yaml"),
        write(tmp_path, "e.json", eps_text),
        write(tmp_path, "r.json", req_text),
    )
    assert code == 1
    assert out["error"]["code"] == "BadRequest"
    assert fragment in out["error"]["message"]


def test_pick_bad_config_is_a_json_error(tmp_path, capsys):
    cfg = write(tmp_path, "c.yaml", "plugins:\n- type: nope\n")
    code, out = run_pick(capsys, cfg, write(tmp_path, "e.json", "[]"), write(tmp_path, "r.json", "{}"))
    assert code == 1
    assert "unknown plugin type 'nope'" in out["error"]["message"]


def test_pick_no_endpoints_is_service_unavailable(tmp_path, capsys):
    req = write(tmp_path, "r.json", {"body": {"model": "m", "prompt": "x"}})
    code, out = run_pick(capsys, "default", write(tmp_path, "e.json", "[]"), req)
    assert code == 1
    assert out["error"]["code"] == "ServiceUnavailable"


def test_validate_prints_defaults_and_errors(tmp_path, capsys):
    assert main(["validate", str(ROOT / "ray_epp" / "configs" / "default.yaml")]) == 0
    out = capsys.readouterr().out
    assert "single-profile-handler" in out and "max-score-picker" in out
    bad = write(tmp_path, "bad.yaml", "plugins:\n- type: queue-scorer\n  parameters: {x: 1}\n")
    assert main(["validate", bad]) == 1
    assert "parameters.x: unknown parameter" in capsys.readouterr().err


def test_epp_console_script_runs_shipped_example():
    """The README's example, through the installed entry point."""
    epp = Path(sys.executable).parent / "epp"
    proc = subprocess.run(
        [
            str(epp),
            "pick",
            "--config",
            "ray_epp/configs/default.yaml",
            "--endpoints",
            "ray_epp/examples/endpoints.json",
            "--request",
            "ray_epp/examples/request.json",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["primary_profile"] == "default"
    assert out["profiles"]["default"] == ["pod-b"]
