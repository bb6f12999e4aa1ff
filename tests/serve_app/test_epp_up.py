"""`epp up` as a user runs it: it serves, Ctrl-C stops it, and no Ray process outlives it; a bad
config or pods file stops it with one clear message."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from tests.conftest import GATEWAY_TEST_PORT

ROOT = Path(__file__).resolve().parents[2]
EPP = str(Path(sys.executable).parent / "epp")


def test_up_serves_and_ctrl_c_leaves_no_ray_process():
    proc = subprocess.Popen(
        [EPP, "up", "--port", str(GATEWAY_TEST_PORT + 250), "--sim-pods", "2"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        url = None
        deadline = time.monotonic() + 240
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                pytest.fail(f"epp up exited with {proc.returncode} before it was up")
            if line.startswith("Ray EPP is up: "):
                url = line.split()[4]
        assert url, "epp up did not come up in time"
        assert "curl -s" in proc.stdout.readline()
        descendants = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
        assert any("raylet" in " ".join(psutil.Process(p).cmdline()) for p in descendants if psutil.pid_exists(p))
        body = json.dumps({"model": "meta-llama/Llama-3.1-8B-Instruct", "prompt": "Hi", "max_tokens": 3}).encode()
        req = urllib.request.Request(f"{url}/v1/completions", data=body, headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            assert resp.status == 200
            assert resp.headers["x-gateway-destination-endpoint"].startswith("127.0.0.1:")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(120) == 0
        time.sleep(1)
        alive = [p for p in descendants if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        assert alive == [], [" ".join(psutil.Process(p).cmdline())[:120] for p in alive]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--config", "nope.yaml"], "can not read config file"),
        (["--pods", "nope.yaml"], "can not read pods file"),
        (["--pods", "{tmp}/pods.yaml"], "pods"),
    ],
)
def test_bad_config_or_pods_stops_up_with_one_message(tmp_path, args, fragment):
    (tmp_path / "pods.yaml").write_text("- name: a\n  port: not-a-port\n")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    proc = subprocess.run(
        [EPP, "up", "--port", str(GATEWAY_TEST_PORT + 260), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("epp up: ")
    assert fragment in proc.stderr
    assert "Traceback" not in proc.stderr
