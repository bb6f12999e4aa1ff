"""The background-thread helper (for synchronous tests of other layers) and the command line."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from ray_epp.simulator import DEFAULT_MODEL, POD_HEADER, PodConfig, add_sim_arguments, start_sim_pods_in_thread
from ray_epp.simulator.cli import serve

ROOT = Path(__file__).resolve().parents[2]


def post(url: str, body: dict[str, object], timeout: float = 5.0) -> tuple[int, dict[str, str], dict[str, object]]:
    req = urllib.request.Request(
        url + "/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.status, dict(resp.headers), json.loads(resp.read())


def test_threaded_pods_serve_stop_one_and_shut_down_cleanly() -> None:
    before = threading.active_count()
    configs = [PodConfig(name="a"), PodConfig(name="b", role="decode"), PodConfig(name="c")]
    with start_sim_pods_in_thread(configs, time_scale=0.01) as sim:
        assert [p.name for p in sim.pods] == ["a", "b", "c"] and len(sim) == 3
        assert len({p.port for p in sim}) == 3 and all(p.port > 0 for p in sim)
        assert sim.pods_json()[1] == {"name": "b", "address": "127.0.0.1", "port": sim[1].port,
                                      "labels": {"llm-d.ai/role": "decode"}}  # fmt: skip
        for p in sim:
            status, headers, out = post(p.url, {"model": DEFAULT_MODEL, "prompt": "hello", "max_tokens": 3})
            assert status == 200 and headers[POD_HEADER] == p.name and out["usage"]["completion_tokens"] == 3
        assert sim[0].snapshot()["running_requests_size"] == 0
        sim[1].stop()
        with pytest.raises(urllib.error.URLError):
            post(sim[1].url, {"model": DEFAULT_MODEL, "prompt": "x"}, timeout=2)
        sim[2].set_failures({"rate": 1.0, "types": ["503"]})
        with pytest.raises(urllib.error.HTTPError) as err:
            post(sim[2].url, {"model": DEFAULT_MODEL, "prompt": "x"})
        assert err.value.code == 503
        assert post(sim[0].url, {"model": DEFAULT_MODEL, "prompt": "x"})[0] == 200
    sim.stop()  # idempotent
    assert not sim._thread.is_alive() and threading.active_count() == before
    with pytest.raises(urllib.error.URLError):
        post(sim[0].url, {"model": DEFAULT_MODEL, "prompt": "x"}, timeout=2)


def test_threaded_start_failure_is_raised_and_cleans_up() -> None:
    with start_sim_pods_in_thread(1, time_scale=0) as sim:
        taken = sim[0].port
        before = threading.active_count()
        with pytest.raises(OSError):
            start_sim_pods_in_thread(2, base_port=taken)
        assert threading.active_count() == before


async def test_serve_reads_a_yaml_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "pods.yaml"
    config.write_text(
        "defaults:\n  max_loras: 2\n  lora_adapters: [sql]\npods:\n"
        "  - name: pre\n    role: prefill\n  - name: dec\n    role: decode\n    labels: {zone: a}\n"
    )
    args = add_sim_arguments(argparse.ArgumentParser()).parse_args(
        ["--config", str(config), "--base-port", "0", "--time-scale", "0", "--pods-json", str(tmp_path / "p.json")]
    )
    stop = asyncio.Event()
    task = asyncio.create_task(serve(args, stop))
    for _ in range(100):
        if (tmp_path / "p.json").exists():
            break
        await asyncio.sleep(0.02)
    pods = json.loads((tmp_path / "p.json").read_text())
    stop.set()
    await task
    assert [p["name"] for p in pods] == ["pre", "dec"]
    assert pods[1]["labels"] == {"zone": "a", "llm-d.ai/role": "decode"}
    out = capsys.readouterr().out
    assert "pre http://127.0.0.1:" in out and json.dumps(pods) in out


def test_cli_main_runs_pods_until_interrupted() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "ray_epp.simulator", "--pods", "2", "--base-port", "0", "--time-scale", "0",
         "--seed", "1"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(3)]
        pods = json.loads(lines[2])
        assert [p["name"] for p in pods] == ["sim-0", "sim-1"]
        status, headers, _ = post(f"http://127.0.0.1:{pods[1]['port']}", {"model": DEFAULT_MODEL, "prompt": "x"})
        assert status == 200 and headers[POD_HEADER] == "sim-1"
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0


def test_cli_reports_a_bad_config(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("pods:\n  - name: x\n    max_num_seqs: lots\n")
    proc = subprocess.run(
        [sys.executable, "-m", "ray_epp.simulator", "--config", str(config), "--base-port", "0"],
        cwd=ROOT, capture_output=True, text=True, timeout=30, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert proc.returncode == 1 and "max_num_seqs" in proc.stderr
