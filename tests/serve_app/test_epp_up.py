"""`epp up` as a user runs it: it serves, Ctrl-C stops it, and no Ray process outlives it; started
again at once it comes up on the same port; a held port, a bad config or pods file stops it with
one clear message; it listens on 127.0.0.1 only; an operator's `ray` and `serve` tools and a
driver attach to it through `epp env`."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import httpx
import psutil
import pytest
import yaml

from tests.conftest import GATEWAY_TEST_PORT

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
EPP = str(BIN / "epp")
# Where a test is not about Ray's dashboard (the first run's are), `epp up` runs without it:
# its start costs seconds here, and tens of seconds on a loaded machine.
NO_DASHBOARD = ("--no-dashboard",)


def start_up(port: int, *extra: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    """`epp up` in its own session (environment `env`, else ours); returns it with the URL it
    printed once up."""
    proc = subprocess.Popen(
        [EPP, "up", "--port", str(port), "--sim-pods", "2", *extra],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
        env=env,
    )
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                pytest.fail(f"epp up exited with {proc.returncode} before it was up")
            if line.startswith("Ray EPP is up: "):
                assert "curl -s" in proc.stdout.readline()
                return proc, line.split()[4]
        pytest.fail("epp up did not come up in time")
    except BaseException:
        stop_up(proc)
        raise


def stop_up(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)


def complete(url: str, http10: bool = False) -> None:
    """One completion. HTTP/1.0: the server closes the connection, so its side is left in
    TIME_WAIT on the gateway port."""
    body = json.dumps({"model": "meta-llama/Llama-3.1-8B-Instruct", "prompt": "Hi", "max_tokens": 3}).encode()
    if http10:
        with httpx.Client(timeout=60, headers={"connection": "close"}) as c:
            resp = c.post(f"{url}/v1/completions", content=body, headers={"content-type": "application/json"})
        assert resp.status_code == 200
        return
    req = urllib.request.Request(f"{url}/v1/completions", data=body, headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert resp.status == 200
        assert resp.headers["x-gateway-destination-endpoint"].startswith("127.0.0.1:")


def server_time_wait(port: int) -> int:
    return sum(
        1
        for c in psutil.net_connections(kind="tcp")
        if c.status == psutil.CONN_TIME_WAIT and c.laddr and c.laddr.port == port
    )


def listening(pids: set[int]) -> list[tuple[str, int, str]]:
    out = []
    for c in psutil.net_connections(kind="inet"):
        if c.status == psutil.CONN_LISTEN and c.pid in pids:
            with contextlib.suppress(psutil.Error):
                out.append((c.laddr.ip, c.laddr.port, psutil.Process(c.pid).name()))
    return out


def is_loopback(ip: str) -> bool:
    return ipaddress.ip_address(ip.removeprefix("::ffff:")).is_loopback


def ray_processes_of(proc: subprocess.Popen) -> list[int]:
    descendants = [p.pid for p in psutil.Process(proc.pid).children(recursive=True)]
    assert any("raylet" in " ".join(psutil.Process(p).cmdline()) for p in descendants if psutil.pid_exists(p))
    return descendants


def ray_started(proc: subprocess.Popen) -> bool:
    """Whether the run's own Ray has started its GCS server."""
    with contextlib.suppress(psutil.Error):
        return any(p.name() == "gcs_server" for p in psutil.Process(proc.pid).children(recursive=True))
    return False


def assert_ctrl_c_stops_everything(proc: subprocess.Popen, descendants: list[int]) -> None:
    proc.send_signal(signal.SIGINT)
    assert proc.wait(120) == 0
    time.sleep(1)
    alive = [p for p in descendants if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert alive == [], [" ".join(psutil.Process(p).cmdline())[:120] for p in alive]


def assert_loopback_only(proc: subprocess.Popen, port: int) -> None:
    """The embedded default: everything of the run (the gateway, the profile actors' channel, the
    simulated pods, and Ray's own servers) listens on 127.0.0.1, except the one gRPC server Serve
    gives each replica on all interfaces (token-authenticated; README "Network exposure")."""
    run = {proc.pid} | {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
    sockets = listening(run)
    ours = [s for s in sockets if s[1] == port or s[2].startswith(("ray::ProfileActor", "epp", "python"))]
    assert any(s[1] == port for s in ours)
    assert [s for s in ours if not is_loopback(s[0])] == []
    beyond = [s for s in sockets if not is_loopback(s[0])]
    assert all(s[2].startswith("ray::ServeReplica") for s in beyond), beyond
    assert len(beyond) <= 1, beyond  # one replica: Serve's inter-deployment gRPC server


PORT = GATEWAY_TEST_PORT + 250


@pytest.fixture(scope="module")
def first_run():
    """`epp up` as a user starts it (Ray's dashboard too: it must listen on 127.0.0.1 alone): its
    process, URL and Ray processes. The loopback, an operator's tools and Ctrl-C are checked on this
    one run, in that order (one `epp up` start costs ~20 s here)."""
    proc, url = start_up(PORT)
    try:
        yield proc, url, ray_processes_of(proc)
    finally:
        stop_up(proc)


def test_up_serves_on_loopback(first_run):
    proc, url, _ = first_run
    assert url == f"http://127.0.0.1:{PORT}"
    complete(url)
    assert_loopback_only(proc, PORT)


def operator_env(line: str) -> dict[str, str]:
    """The environment a shell has after `eval "$(epp env)"`: ours, with the line's exports."""
    assert line.startswith("export ")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    for item in line.removeprefix("export ").split():
        key, _, value = item.partition("=")
        env[key] = value
    return env


def run_as_operator(cmd: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd="/", env=env, capture_output=True, text=True, timeout=120)


def test_ray_tools_and_a_driver_attach_to_epp_up(first_run):
    """An operator's way into the Ray cluster `epp up` started, as docs/INSTALL.md ("Operators")
    says: `eval "$(epp env)"`, then `ray status`, `ray list actors`, `serve status` and a Python
    driver reach it and see its actors (the line goes away when it stops: the Ctrl-C test)."""
    printed = run_as_operator([EPP, "env", "--port", str(PORT)], dict(os.environ))
    assert printed.returncode == 0, printed.stderr
    env = operator_env(printed.stdout.strip())
    assert env["RAY_DASHBOARD_ADDRESS"].startswith("http://127.0.0.1:")

    status = run_as_operator([str(BIN / "ray"), "status"], env)
    assert status.returncode == 0, status.stderr[-2000:]
    assert "Node status" in status.stdout

    actors = run_as_operator([str(BIN / "ray"), "list", "actors", "--format", "yaml", "--limit", "1000"], env)
    assert actors.returncode == 0, actors.stderr[-2000:]
    names = {a.get("name") for a in yaml.safe_load(actors.stdout)}
    assert {"epp-datastore", "epp-datastore:profile:default", "SERVE_CONTROLLER_ACTOR"} <= names

    serve = run_as_operator([str(BIN / "serve"), "status"], env)
    assert serve.returncode == 0, serve.stderr[-2000:]
    apps = yaml.safe_load(serve.stdout)["applications"]
    assert apps["epp"]["status"] == "RUNNING"

    driver = run_as_operator(
        [sys.executable, "-c",
         "import ray; ray.init(log_to_driver=False)\n"
         "print(sorted(a['name'] for a in ray.util.list_named_actors(all_namespaces=True)))"],
        env,
    )  # fmt: skip
    assert driver.returncode == 0, driver.stderr[-2000:]
    assert "epp-datastore" in driver.stdout


def start_two_at_once(port: int, tmp_path: Path) -> tuple[list[subprocess.Popen], list[Path], list[Path]]:
    """Two `epp up` on one port at the same moment (without the dashboard, each with a Serve proxy
    port of its own); their processes and the files of their stdout and stderr."""
    procs, outs, errs = [], [], []
    for i in range(2):
        outs.append(tmp_path / f"out{i}")
        errs.append(tmp_path / f"err{i}")
        with outs[i].open("w") as out, errs[i].open("w") as err:
            cmd = [EPP, "up", "--port", str(port), "--proxy-port", str(port + 1 + i), "--sim-pods", "2", *NO_DASHBOARD]
            procs.append(subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=err, text=True, start_new_session=True))
    return procs, outs, errs


def test_ctrl_c_stops_everything_then_two_ups_at_once_on_the_same_port_do_not_share_it(first_run, tmp_path):
    """The first run's Ctrl-C leaves no Ray process behind and `epp env` finds no run. Two runs
    are then started at once on the same port, its connections still in TIME_WAIT there (which
    moved the gateway to the next port before): both pass the free-port check (neither gateway
    listens yet). The second gateway must not join the first one's SO_REUSEPORT group, where the
    kernel would split clients between two deployments: it stops with one message naming the
    owner; the winner serves on the same port, its replica alone holds it, and its Ctrl-C leaves
    nothing behind either. (One pair of runs checks both: each `epp up` start costs ~20 s.)"""
    proc, url, descendants = first_run
    for _ in range(3):
        complete(url, http10=True)
    assert_ctrl_c_stops_everything(proc, descendants)
    gone = run_as_operator([EPP, "env", "--port", str(PORT)], dict(os.environ))
    assert gone.returncode == 1
    assert f"no `epp up` on port {PORT}" in gone.stderr
    assert server_time_wait(PORT) > 0

    procs, outs, errs = start_two_at_once(PORT, tmp_path)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            up = [i for i in range(2) if "Ray EPP is up" in outs[i].read_text()]
            refused = [i for i in range(2) if procs[i].poll() is not None]
            if len(up) == 1 and len(refused) == 1:
                break
            assert len(refused) < 2, [e.read_text()[-800:] for e in errs]
            assert len(up) < 2, "both came up on one port"
            time.sleep(0.5)
        else:
            pytest.fail(f"not one up and one refused: {[e.read_text()[-800:] for e in errs]}")
        winner, loser = up[0], refused[0]
        assert winner != loser
        said = errs[loser].read_text()
        assert procs[loser].returncode == 2, said
        assert f"epp up: the gateway did not start: [Errno 98] port {PORT} on 127.0.0.1 is in use by pid" in said
        assert "its gateway port group was claimed by ray cluster" in said and "Traceback" not in said
        up_line = next(line for line in outs[winner].read_text().splitlines() if line.startswith("Ray EPP is up: "))
        assert up_line.split()[4] == url == f"http://127.0.0.1:{PORT}"
        run = {p.pid for p in psutil.Process(procs[winner].pid).children(recursive=True)}
        holders = [
            c.pid for c in psutil.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN and c.laddr.port == PORT
        ]
        assert holders and set(holders) <= run, holders
        complete(url)
        descendants = ray_processes_of(procs[winner])
        assert_ctrl_c_stops_everything(procs[winner], descendants)
    finally:
        for p in procs:
            stop_up(p)


def test_env_without_a_running_up_says_so():
    out = subprocess.run([EPP, "env", "--port", "1"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert "no `epp up` on port 1 is running" in out.stderr


def test_up_on_a_held_port_names_the_process_that_holds_it():
    port = GATEWAY_TEST_PORT + 254
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        proc = subprocess.run([EPP, "up", "--port", str(port)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.startswith("epp up: ")
    assert f"port {port} on 127.0.0.1 is in use by pid {os.getpid()}" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_ctrl_c_while_starting_stops_with_one_message():
    """Ctrl-C before "Ray EPP is up" (here: while Ray and Serve start): a clear line and exit 130,
    not a KeyboardInterrupt traceback. Not asserted: that nothing is left behind. Interrupted inside
    ray.init, Ray's DashboardAgent and RuntimeEnvAgent were seen to outlive the raylet (docs/
    RELIABILITY.md); the test kills the run's process group at the end."""
    # Ctrl-C's default action in the child even where the test runner was started with SIGINT
    # ignored (a background job of a non-interactive shell): Python then keeps ignoring it
    proc = subprocess.Popen(
        [EPP, "up", "--port", str(GATEWAY_TEST_PORT + 262), "--sim-pods", "2", *NO_DASHBOARD],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    try:
        # past the checks, inside ray.init / serve.start: the run's Ray has begun (its GCS is up)
        deadline = time.monotonic() + 120
        while not ray_started(proc) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        stop_up(proc)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # what Ray left in the run's session
    assert "Ray EPP is up" not in out, "too slow a start to interrupt: it was up already"
    assert proc.returncode == 130, err
    assert "epp up: interrupted while starting" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--config", "nope.yaml"], "no config 'nope.yaml'"),
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
