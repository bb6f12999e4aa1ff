"""`epp up --address` joins a Ray cluster that someone else runs and leaves it running: a head
started with `ray start` (its own temp dir and ports, 127.0.0.1) already holds another driver's
detached actor and Serve application; `epp up --address 127.0.0.1:P` serves a completion, Ctrl-C
stops it, and afterwards the cluster, the other actor and the other application are still there
while our application and every actor of ours (datastore, metrics, profile, hub) are gone.

The pytest process never connects to that cluster (the session Ray may be attached): every look
into it is a short driver in a subprocess. Joining by an explicit address needs RAY_AUTH_MODE=token
(Ray enables token auth on a new cluster, but never on its own for an explicit address)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from bench.local_cluster import write_agent_port_files
from tests.conftest import GATEWAY_TEST_PORT
from tests.serve_app.test_epp_up import complete, start_up, stop_up

ROOT = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).parent / "ray")
HEAD_PORT = GATEWAY_TEST_PORT + 270  # the GCS; the raylet's, object manager's and workers' ports follow


def cluster_env(tmp: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        RAY_TMPDIR=str(tmp),  # `auto` and the session files stay in this cluster's own directory
        RAY_AUTH_MODE="token",
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",  # keep 127.0.0.1 (serve_app/cli/launch.py local_ray_env)
        RAY_USAGE_STATS_ENABLED="0",
        RAY_SERVE_ENABLE_DIRECT_INGRESS="0",
        # a raylet gives its dashboard agent this long to start (default 30 s; it takes longer on a
        # loaded machine, and then the raylet exits)
        RAY_agent_register_timeout_ms="180000",
    )
    return env


def driver(env: dict[str, str], code: str, timeout: float = 120) -> dict:
    """Run `code` in a driver attached to the cluster; it prints one JSON line, returned here."""
    script = f"import json, ray\nray.init(address='127.0.0.1:{HEAD_PORT}', log_to_driver=False)\n"
    script += textwrap.dedent(code)
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


BYSTANDERS = """
from ray import serve

@ray.remote
class Bystander:
    def pid(self):
        import os
        return os.getpid()

@serve.deployment(ray_actor_options={"num_cpus": 0})
def other(request):
    return "other"

actor = Bystander.options(name="bystander", namespace="someone-else", lifetime="detached", num_cpus=0,
                          get_if_exists=True).remote()  # the attach loop may run this twice
pid = ray.get(actor.pid.remote())
serve.start(http_options={"host": "127.0.0.1", "port": %d})
serve.run(other.bind(), name="other-app", route_prefix="/other")
print(json.dumps({"pid": pid}))
"""

LOOK = """
from ray import serve

named = ray.util.list_named_actors(all_namespaces=True)
apps = sorted(serve.status().applications)
pid = ray.get(ray.get_actor("bystander", namespace="someone-else").pid.remote(), timeout=30)
print(json.dumps({"named": sorted(f"{a['namespace']}/{a['name']}" for a in named), "apps": apps, "pid": pid,
                  "nodes": sum(n["Alive"] for n in ray.nodes())}))
"""


def write_port_files_when_started(tmp: Path, node_id: str, ports: dict[str, int], stop: threading.Event) -> None:
    """`ray start` names its session directory itself: write the head's agent port files
    (bench/local_cluster.py) as soon as it is there."""
    while not stop.is_set():
        session = tmp / "session_latest"
        if session.exists():
            write_agent_port_files(str(session.resolve()), node_id, ports)
            return
        time.sleep(0.05)


@pytest.fixture()
def head(tmp_path_factory):
    """`ray start --head --block` in its own session: killing that session takes the cluster away
    (never `ray stop`, which stops every Ray on the machine)."""
    tmp = Path(os.environ.get("RAY_TMPDIR", "/tmp")) / f"join{os.getpid()}"
    tmp.mkdir(parents=True, exist_ok=True)
    env = cluster_env(tmp)
    p = HEAD_PORT
    node_id = os.urandom(28).hex()  # a Ray node id: 28 bytes
    env["RAY_OVERRIDE_NODE_ID_FOR_TESTING"] = node_id
    ports = {"metrics_agent_port": p + 7, "metrics_export_port": p + 5}
    ports.update(dashboard_agent_listen_port=p + 4, runtime_env_agent_port=p + 6)
    stop = threading.Event()
    threading.Thread(target=write_port_files_when_started, args=(tmp, node_id, ports, stop), daemon=True).start()
    proc = subprocess.Popen(
        [RAY, "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={p}", "--num-cpus=4",
         "--include-dashboard=false", f"--temp-dir={tmp}", f"--ray-client-server-port={p + 1}",
         f"--node-manager-port={p + 2}", f"--object-manager-port={p + 3}", f"--dashboard-agent-listen-port={p + 4}",
         f"--metrics-export-port={p + 5}", f"--runtime-env-agent-port={p + 6}", f"--dashboard-agent-grpc-port={p + 7}",
         f"--min-worker-port={p + 10}", f"--max-worker-port={p + 60}"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        yield env, proc
    finally:
        stop.set()
        # SIGKILL at once: `ray start --block`'s graceful stop on SIGTERM took over 20 s under load
        # (the wait ran out, then SIGKILL), and nothing here is about it; the cluster's processes
        # (its head, workers, the bystander, Serve) are all of this session and go with it.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(20)


def test_up_joins_a_cluster_and_leaves_it_running(head):
    env, head_proc = head
    deadline = time.monotonic() + 90
    while True:  # the head is up once a driver can attach
        try:
            before = driver(env, BYSTANDERS % (HEAD_PORT + 8), timeout=90)
            break
        except (AssertionError, subprocess.TimeoutExpired):
            if time.monotonic() > deadline or head_proc.poll() is not None:
                raise
            time.sleep(1)
    port = GATEWAY_TEST_PORT + 340  # outside the head's ports (HEAD_PORT .. HEAD_PORT + 60: its workers')
    up, url = start_up(port, "--address", f"127.0.0.1:{HEAD_PORT}", env=env)
    try:
        complete(url)
        during = driver(env, LOOK)
        assert "epp" in during["apps"] and "other-app" in during["apps"]
        ours = [n for n in during["named"] if n.startswith("ray-epp/")]
        assert any(n.endswith("epp-datastore") for n in ours) and any(":profile:" in n for n in ours), ours
        up.send_signal(signal.SIGINT)
        assert up.wait(120) == 0
    finally:
        stop_up(up)
    after = driver(env, LOOK)
    assert head_proc.poll() is None, "the cluster is still running"
    assert after["nodes"] == 1
    assert after["apps"] == ["other-app"], "only our application went away"
    assert after["pid"] == before["pid"], "the other driver's actor was not touched"
    assert [n for n in after["named"] if n.startswith("ray-epp/")] == [], "every actor of ours is gone"
    assert "someone-else/bystander" in after["named"]
