"""What the multi-node test modules share: nodes of a `ray.cluster_utils.Cluster` on this machine
with fixed ports, where an actor runs, and a steady load of requests that records every outcome."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator

import httpx
import ray

from tests.agent_ports import AGENT_PORTS, write_agent_port_files
from tests.conftest import GATEWAY_TEST_PORT

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def node_ports(i: int) -> dict:
    """Fixed ports for node slot i, so that nodes of this machine never meet another checkout's."""
    base = GATEWAY_TEST_PORT + 400 + 20 * i
    ports = dict(zip(AGENT_PORTS, range(base, base + 4), strict=True))
    ports.update(node_manager_port=base + 4, object_manager_port=base + 5, min_worker_port=base + 6)
    return {"node_ip_address": "127.0.0.1", "max_worker_port": base + 19, **ports}


def add_node(c, session_dir: str, i: int, slot: int | None = None, **args):
    """`c.add_node` with fixed ports (of `slot`, default i) and a node id chosen here, its agent
    port files written first (tests/agent_ports.py)."""
    node_id = ray.NodeID.from_random().hex()
    ports = node_ports(i if slot is None else slot)
    write_agent_port_files(session_dir, node_id, ports)
    try:
        return c.add_node(env_vars={"RAY_OVERRIDE_NODE_ID_FOR_TESTING": node_id}, **ports, **args)
    except Exception as e:
        left = kill_node_processes(node_id)
        raise NodeStartError(f"node {i} ({node_id[:8]}) did not register within Ray's 30 s: {e}; {left}") from e


class NodeStartError(RuntimeError):
    pass


WORKER_ATTEMPTS = 3


def add_worker_node(c, session_dir: str, i: int, **args):
    """A worker node, started again (new node id, the next free port slot) when its raylet does
    not register in time. Ray gives a raylet a fixed 30 s (ray/_private/node.py); once a CI run's
    worker raylet wrote no log at all and the module's four tests errored, so one bad start must
    not fail the module."""
    errors = []
    for attempt in range(WORKER_ATTEMPTS):
        try:
            return add_node(c, session_dir, i, slot=i + 3 * attempt, **args)
        except NodeStartError as e:
            errors.append(str(e))
            print(f"multinode: {e}; starting it again", flush=True)
    raise NodeStartError(" | ".join(errors))


def kill_node_processes(node_id: str) -> str:
    """Kill what a failed node start left running (its raylet and the agents it spawned carry the
    node id in their command line or environment), so it can never join later as a ghost node.
    Returns what was found, for the error message."""
    import contextlib
    import signal

    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if node_id.encode() in cmd or node_id.encode() in env:
            name = os.path.basename(cmd.split(b"\0", 1)[0].decode(errors="replace"))
            found.append(f"{name}[{pid}]")
            with contextlib.suppress(OSError):
                os.kill(int(pid), signal.SIGKILL)
    return f"killed what it left running: {', '.join(found)}" if found else "none of its processes was running"


def actor_node(handle) -> str:
    """The node id an actor runs on (GCS's actor table; no dashboard needed)."""
    return ray._private.state.actors(handle._actor_id.hex())["Address"]["NodeID"]


def actor_state(handle) -> str:
    return ray._private.state.actors(handle._actor_id.hex())["State"]


def gateway_replicas(app: str) -> dict[str, str]:
    """Alive gateway replica actors of a Serve application: actor id -> node id."""
    rows = ray._private.state.actors(actor_state_name="ALIVE").values()
    return {r["ActorID"]: r["Address"]["NodeID"] for r in rows if f"{app}#Gateway" in (r.get("Name") or "")}


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


@ray.remote(num_cpus=0)
class Where:
    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()


def placed_on(node_id: str) -> bool:
    """Whether an actor that prefers `node_id` (actors/placement.affinity) lands there. A node
    that just joined is alive in the GCS before the head's raylet has its resources; until then
    the raylet places a soft preference for it locally."""
    from actors.placement import PLACED_MIN_CPUS, affinity

    probe = Where.options(scheduling_strategy=affinity(node_id), num_cpus=PLACED_MIN_CPUS).remote()
    try:
        return ray.get(probe.node.remote(), timeout=60) == node_id
    finally:
        ray.kill(probe)


def complete(client: httpx.Client, port: int, prompt: str = "hello there") -> httpx.Response:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 4}
    return client.post(f"http://127.0.0.1:{port}/v1/completions", json=body)


class Traffic:
    """4 threads, one request at a time each, every request with a 30 s timeout, until stopped
    (or 150 s): (monotonic time sent, monotonic time answered, outcome) for each, outcome "ok" or why
    it failed."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.results: list[tuple[float, float, str]] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.deadline = time.monotonic() + 150
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(4)]
        for t in self.threads:
            t.start()

    def _run(self, worker: int) -> None:
        n = 0
        while not self.stop.is_set() and time.monotonic() < self.deadline:
            n += 1
            sent = time.monotonic()
            try:
                with httpx.Client(timeout=30) as client:  # a fresh connection: the kernel picks a replica
                    resp = complete(client, self.port, f"worker {worker} request {n}")
                outcome = "ok" if resp.status_code == 200 else f"{resp.status_code} {error_message(resp)}"
            except httpx.ConnectError:
                outcome = "connect refused"
            except httpx.TimeoutException:
                outcome = "timed out (30 s)"
            except httpx.HTTPError as err:
                outcome = f"connection broke: {type(err).__name__}"
            with self.lock:
                self.results.append((sent, time.monotonic(), outcome))
            time.sleep(0.02)

    def finish(self) -> list[tuple[float, float, str]]:
        self.stop.set()
        for t in self.threads:
            t.join(40)
        assert not any(t.is_alive() for t in self.threads), "a request hung"
        return sorted(self.results)


def error_message(resp: httpx.Response) -> str:
    try:
        return resp.json()["error"]["message"][:100]
    except Exception:
        return resp.text[:100]


def start_cluster(workers: dict[str, dict[str, str]], head_cpus: int, worker_cpus: int) -> Iterator[tuple]:
    """For a module fixture to yield from: a head (label epp/host=head) and the named workers with
    their labels, this driver attached; yields (cluster, node id by name, node by name). Shuts the
    session Ray down first (tests/conftest.py runs these modules last): a driver attaches to one
    cluster at a time."""
    from ray.cluster_utils import Cluster

    from serve_app.cli.launch import serve_fast_path_env

    if ray.is_initialized():
        ray.shutdown()
    serve_fast_path_env()
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # keep 127.0.0.1 (serve_app/cli/launch.py)
    ray._private.ray_constants.ENABLE_RAY_CLUSTER = False  # this process read it when it imported ray
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ["RAY_agent_register_timeout_ms"] = "180000"  # noqa: SIM112 (Ray's own spelling)
    temp_dir = os.path.join(os.environ.get("RAY_TMPDIR", "/tmp"), "multinode")
    c = Cluster()
    session = f"session_multinode_{os.getpid()}_{len(workers)}"
    session_dir = os.path.join(temp_dir, session)
    nodes = {}
    try:
        nodes["head"] = add_node(
            c,
            session_dir,
            0,
            num_cpus=head_cpus,
            labels={"epp/host": "head"},
            gcs_server_port=GATEWAY_TEST_PORT + 390,
            ray_client_server_port=GATEWAY_TEST_PORT + 391,
            include_dashboard=False,
            temp_dir=temp_dir,
            session_name=session,
        )
        for i, (name, labels) in enumerate(workers.items(), start=1):
            nodes[name] = add_worker_node(c, session_dir, i, num_cpus=worker_cpus, labels=labels)
        ray.init(address=c.address, namespace="ray-epp-multinode", log_to_driver=False)
        for name in workers:
            wait_for(lambda n=name: placed_on(nodes[n].node_id), 90, f"the head's scheduler to see {name}")
        yield c, {name: n.node_id for name, n in nodes.items()}, nodes
    finally:
        ray.shutdown()
        c.shutdown()
