"""The package as a user installs it: the wheel built from this tree, installed (not editable) into
a new virtual environment, used from a folder outside the repository with no source tree on the
path. Every file `epp` reads at run time must be in the wheel: the named configs, the examples.

The new environment gets its third-party dependencies (Ray, pydantic, ...) from this test's own
environment through a path file, so the test does not download or install them again; the
project's own packages come from the wheel alone (the editable install's import hook is not
loaded there), which the first test checks.

One module-scoped wheel and environment; `epp up` runs once, on its own Ray, which it stops."""

from __future__ import annotations

import json
import os
import shutil
import signal
import site
import socket
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SHIPPED_FILES = ("ray_epp/configs/default.yaml", "ray_epp/configs/pd.yaml", "ray_epp/examples/pods.yaml")
UP_TIMEOUT_S = 180
BUILD_LEFTOVERS = (".git", ".venv", "build", "*.egg-info", "__pycache__", ".pytest_cache", "results", ".ruff_cache")


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    """{'bin': the venv's bin folder, 'site': its site-packages, 'cwd': a folder outside the
    repository, 'env': an environment with no PYTHONPATH}."""
    base = tmp_path_factory.mktemp("wheel")
    src, dist, venv, cwd = base / "src", base / "dist", base / "venv", base / "elsewhere"
    cwd.mkdir()
    # A copy of the tree without build outputs: an in-tree build would reuse build/lib's stale files.
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(*BUILD_LEFTOVERS))
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"}}
    built = _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), str(src)],
        cwd, env,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = dist.glob("ray_epp-*.whl")
    made = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd, env)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    site_dir = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], cwd, env)
                    .stdout.strip())  # fmt: skip
    # The dependencies: this environment's site-packages as a plain path entry (its .pth files,
    # the editable install's hook among them, are not run from there).
    (site_dir / "_ray_epp_test_deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    inst = _run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)], cwd, env
    )
    assert inst.returncode == 0, inst.stderr[-3000:]
    return {"bin": venv / "bin", "site": site_dir, "cwd": cwd, "env": env, "wheel": wheel}


def epp(installed: dict, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return _run([str(installed["bin"] / "epp"), *args], installed["cwd"], installed["env"], timeout)


def py(installed: dict, code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return _run([str(installed["bin"] / "python"), "-c", code], installed["cwd"], installed["env"], timeout)


def test_the_wheel_holds_what_runs_and_not_the_lab(installed):
    names = set(zipfile.ZipFile(installed["wheel"]).namelist())
    assert set(SHIPPED_FILES) <= names
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert tops == {"scheduler", "actors", "serve_app", "ray_epp"}


def test_the_project_is_imported_from_the_wheel(installed):
    out = py(installed, "import scheduler, serve_app, ray_epp; print(scheduler.__file__, serve_app.__file__)")
    assert out.returncode == 0, out.stderr
    assert all(p.startswith(str(installed["site"])) for p in out.stdout.split()), out.stdout
    assert py(installed, "import bench").returncode != 0  # the lab stays in the source tree


def test_version(installed):
    out = epp(installed, "--version")
    assert out.returncode == 0, out.stderr
    from ray_epp import __version__

    assert out.stdout.strip() == f"epp (ray-epp) {__version__}"


def test_validate_a_shipped_config_by_name(installed):
    out = epp(installed, "validate", "default")
    assert out.returncode == 0, out.stderr
    assert "schedulingProfiles" in out.stdout


def test_a_missing_config_names_the_path_it_tried(installed):
    out = epp(installed, "validate", "my-epp.yaml")
    assert out.returncode == 1
    assert str(installed["cwd"] / "my-epp.yaml") in out.stderr


def test_examples_are_copied_out(installed, tmp_path):
    out = epp(installed, "examples", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "pods.yaml").is_file() and (tmp_path / "serve_llm.py").is_file()


def test_the_serve_llm_router_builds_with_its_default_config(installed):
    code = (
        "from ray.serve._private.common import DeploymentHandleSource, DeploymentID\n"
        "from serve_app.llm_router.router import EPPRequestRouter\n"
        "r = EPPRequestRouter(deployment_id=DeploymentID(name='d', app_name='a'),"
        " handle_source=DeploymentHandleSource.UNKNOWN)\n"
        "r.initialize_state()\n"
        "print([p.name for p in r._cfg.scheduling_profiles])\n"
    )
    out = py(installed, code)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "['default']"


def test_bench_says_it_runs_from_a_source_checkout(installed):
    out = epp(installed, "bench", "list")
    assert out.returncode == 2
    assert "source checkout" in out.stderr and "Traceback" not in out.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_up_serves_a_completion(installed):
    """`epp up` from the wheel, its default config and one simulated pod, on a free port: one
    completion through it, then Ctrl-C stops it and everything it started."""
    port = free_port()
    proc = subprocess.Popen(
        [str(installed["bin"] / "epp"), "up", "--port", str(port), "--proxy-port", str(free_port()), "--sim-pods", "1"],
        cwd=installed["cwd"], env=installed["env"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    lines: list[str] = []
    try:
        deadline = time.monotonic() + UP_TIMEOUT_S
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if line.startswith("Ray EPP is up"):
                break
        assert any(line.startswith("Ray EPP is up") for line in lines), "".join(lines)[-4000:]
        body = json.dumps({"model": "meta-llama/Llama-3.1-8B-Instruct", "prompt": "Hello", "max_tokens": 4})
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions", body.encode(), {"content-type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert resp.status == 200
            assert json.loads(resp.read())["choices"][0]["text"]
            assert resp.headers["x-gateway-destination-endpoint"]
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, rest[-4000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_a_missing_shipped_file_fails_with_a_clear_error(installed):
    """Last in the module (it breaks the installed package): with a packaged config gone, asking
    for it by name fails and says what it tried, rather than a traceback."""
    (installed["site"] / "ray_epp" / "configs" / "default.yaml").unlink()
    out = epp(installed, "validate", "default")
    assert out.returncode == 1
    assert "no config 'default'" in out.stderr and "Traceback" not in out.stderr
