"""Several Ray nodes on this machine (a `ray.cluster_utils.Cluster`) that a busy shared 2-core
machine does not abort at start-up: fixed ports per node slot from a base port (so nodes of two
checkouts never meet), a node id chosen up front with its dashboard agent's port files written
first, and a worker started again when its raylet does not register in time. Used by the
multi-node tests (tests/multinode) and the soak's node losses (bench/soak.py --nodes).

A raylet waits at most 15-30 s (not configurable) for its dashboard agent to write the agent's
ports into the session directory, even when the ports were given, and exits then; here the agent
can take a minute to import. Writing those files first lets the raylet go on; the agent writes the
same ports when it is up."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import ray

AGENT_PORTS = ("metrics_agent_port", "metrics_export_port", "dashboard_agent_listen_port", "runtime_env_agent_port")
WORKER_ATTEMPTS = 3


class NodeStartError(RuntimeError):
    pass


def write_agent_port_files(session_dir: str, node_id: str, ports: dict[str, int]) -> None:
    """`ports`: a port for each name in AGENT_PORTS."""
    os.makedirs(session_dir, exist_ok=True)
    for name in AGENT_PORTS:
        with open(os.path.join(session_dir, f"{name}_{node_id}"), "w") as f:
            f.write(str(ports[name]))


def node_ports(base: int, slot: int) -> dict[str, Any]:
    """Fixed ports for node `slot`: 20 from base + 20 * slot."""
    first = base + 20 * slot
    ports: dict[str, Any] = dict(zip(AGENT_PORTS, range(first, first + 4), strict=True))
    ports.update(node_manager_port=first + 4, object_manager_port=first + 5, min_worker_port=first + 6)
    return {"node_ip_address": "127.0.0.1", "max_worker_port": first + 19, **ports}


def add_node(c: Any, session_dir: str, base: int, slot: int, **args: Any) -> Any:
    """`c.add_node` with the fixed ports of `slot` and a node id chosen here, its agent port files
    written first."""
    node_id = ray.NodeID.from_random().hex()
    ports = node_ports(base, slot)
    write_agent_port_files(session_dir, node_id, ports)
    try:
        return c.add_node(env_vars={"RAY_OVERRIDE_NODE_ID_FOR_TESTING": node_id}, **ports, **args)
    except Exception as e:
        left = kill_node_processes(node_id)
        raise NodeStartError(f"node slot {slot} ({node_id[:8]}) did not register within Ray's 30 s: {e}; {left}") from e


def add_worker_node(c: Any, session_dir: str, base: int, slot: int, stride: int = 3, **args: Any) -> Any:
    """A worker node, started again (new node id, the slot `stride` further) when its raylet does
    not register in time: once a CI run's worker raylet wrote no log at all, so one bad start must
    not fail the caller."""
    errors = []
    for attempt in range(WORKER_ATTEMPTS):
        try:
            return add_node(c, session_dir, base, slot + stride * attempt, **args)
        except NodeStartError as e:
            errors.append(str(e))
            print(f"local cluster: {e}; starting it again", flush=True)
    raise NodeStartError(" | ".join(errors))


def kill_node_processes(node_id: str) -> str:
    """Kill what a failed node start left running (its raylet and the agents it spawned carry the
    node id in their command line or environment), so it can never join later as a ghost node.
    Returns what was found, for the error message."""
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


def wait_for(predicate: Any, timeout: float, what: str) -> Any:
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


def session_dir(temp_dir: str, session: str) -> str:
    return os.path.join(temp_dir, session)


def start_cluster(
    workers: dict[str, dict[str, str]], head_cpus: int, worker_cpus: int, base: int, namespace: str
) -> Iterator[tuple]:
    """To yield from: a head (label epp/host=head) and the named workers with their labels, this
    driver attached; yields (cluster, node id by name, node by name, session directory). Shuts
    this process's Ray down first: a driver attaches to one cluster at a time. Node slot 0 is the
    head, 1.. the workers; the head's GCS listens on base - 10."""
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
    # Cluster writes the head's address to <RAY_TMPDIR>/ray/ray_current_cluster, and fails on a
    # fresh RAY_TMPDIR without that folder
    os.makedirs(os.path.join(os.environ.get("RAY_TMPDIR", "/tmp"), "ray"), exist_ok=True)
    c = Cluster()
    session = f"session_multinode_{os.getpid()}_{len(workers)}"
    sdir = session_dir(temp_dir, session)
    nodes = {}
    try:
        nodes["head"] = add_node(
            c,
            sdir,
            base,
            0,
            num_cpus=head_cpus,
            labels={"epp/host": "head"},
            gcs_server_port=base - 10,
            ray_client_server_port=base - 9,
            include_dashboard=False,
            temp_dir=temp_dir,
            session_name=session,
        )
        for i, (name, labels) in enumerate(workers.items(), start=1):
            nodes[name] = add_worker_node(c, sdir, base, i, stride=len(workers), num_cpus=worker_cpus, labels=labels)
        ray.init(address=c.address, namespace=namespace, log_to_driver=False)
        for name in workers:
            wait_for(lambda n=name: placed_on(nodes[n].node_id), 90, f"the head's scheduler to see {name}")
        yield c, {name: n.node_id for name, n in nodes.items()}, nodes, sdir
    finally:
        ray.shutdown()
        c.shutdown()
