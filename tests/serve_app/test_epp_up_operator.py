"""An operator's way into the Ray cluster `epp up` started, as docs/INSTALL.md ("Operators") says:
`eval "$(epp env)"`, then `ray status`, `ray list actors`, `serve status` and a Python driver
reach it and see its actors; the line goes away when `epp up` stops."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from tests.conftest import GATEWAY_TEST_PORT
from tests.serve_app.test_epp_up import EPP, ROOT, assert_ctrl_c_stops_everything, ray_processes_of, start_up, stop_up

BIN = Path(sys.executable).parent
PORT = GATEWAY_TEST_PORT + 270


def operator_env(line: str) -> dict[str, str]:
    """The environment a shell has after `eval "$(epp env)"`: ours, with the line's exports."""
    assert line.startswith("export ")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    for item in line.removeprefix("export ").split():
        key, _, value = item.partition("=")
        env[key] = value
    return env


def run(cmd: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd="/", env=env, capture_output=True, text=True, timeout=120)


def test_ray_tools_and_a_driver_attach_to_epp_up():
    proc, _ = start_up(PORT, "--proxy-port", str(PORT + 1))
    try:
        descendants = ray_processes_of(proc)
        printed = run([EPP, "env", "--port", str(PORT)], dict(os.environ))
        assert printed.returncode == 0, printed.stderr
        env = operator_env(printed.stdout.strip())
        assert env["RAY_DASHBOARD_ADDRESS"].startswith("http://127.0.0.1:")

        status = run([str(BIN / "ray"), "status"], env)
        assert status.returncode == 0, status.stderr[-2000:]
        assert "Node status" in status.stdout

        actors = run([str(BIN / "ray"), "list", "actors", "--format", "yaml", "--limit", "1000"], env)
        assert actors.returncode == 0, actors.stderr[-2000:]
        names = {a.get("name") for a in yaml.safe_load(actors.stdout)}
        assert {"epp-datastore", "epp-datastore:profile:default", "SERVE_CONTROLLER_ACTOR"} <= names

        serve = run([str(BIN / "serve"), "status"], env)
        assert serve.returncode == 0, serve.stderr[-2000:]
        apps = yaml.safe_load(serve.stdout)["applications"]
        assert apps["epp"]["status"] == "RUNNING"

        driver = run(
            [sys.executable, "-c",
             "import ray; ray.init(log_to_driver=False)\n"
             "print(sorted(a['name'] for a in ray.util.list_named_actors(all_namespaces=True)))"],
            env,
        )  # fmt: skip
        assert driver.returncode == 0, driver.stderr[-2000:]
        assert "epp-datastore" in driver.stdout

        assert_ctrl_c_stops_everything(proc, descendants)
        gone = run([EPP, "env", "--port", str(PORT)], dict(os.environ))
        assert gone.returncode == 1
        assert f"no `epp up` on port {PORT}" in gone.stderr
    finally:
        stop_up(proc)


def test_env_without_a_running_up_says_so():
    out = subprocess.run([EPP, "env", "--port", "1"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert "no `epp up` on port 1 is running" in out.stderr
