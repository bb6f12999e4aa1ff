"""Ray EPP on several Ray nodes of one machine: a `ray.cluster_utils.Cluster` of a head and two
workers (each with its own labels), started once for the module, everything on 127.0.0.1.

The pods are simulator pods in this process, assigned to the workers by the pods-file fields
(`node`: a node id, `node_labels`: a label selector); the profile actors prefer w1
(`profile_node_labels`); the gateway runs 3 replicas, which Serve spreads over the nodes; the
datastore runs on the head, next to this driver. The tests check where each actor runs (node ids),
that a gateway replica on another node than the profile actor schedules by Ray calls (not the
same-node channel), both metrics-actor scopes, and finally the loss of w1 under traffic.

This module runs last (tests/conftest.py) and shuts the session Ray down first: a driver attaches
to one cluster at a time."""

from __future__ import annotations

import os
import threading
import time
from collections import Counter

import httpx
import pytest

from tests.agent_ports import AGENT_PORTS, write_agent_port_files
from tests.conftest import GATEWAY_TEST_PORT

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.ray

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
PORT = GATEWAY_TEST_PORT + 300  # the gateway; Serve's proxy at +88; the nodes' own ports from +400
APP = "epp-multinode"
DATASTORE = "mn-datastore"


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


def gateway_replicas() -> dict[str, str]:
    """Alive gateway replica actors: actor id -> node id."""
    rows = ray._private.state.actors(actor_state_name="ALIVE").values()
    return {r["ActorID"]: r["Address"]["NodeID"] for r in rows if f"{APP}#Gateway" in (r.get("Name") or "")}


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


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    from serve_app.cli.launch import serve_fast_path_env

    if ray.is_initialized():
        ray.shutdown()  # the session Ray (tests/conftest.py): this module runs last
    serve_fast_path_env()
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # keep 127.0.0.1 (serve_app/cli/launch.py)
    ray._private.ray_constants.ENABLE_RAY_CLUSTER = False  # this process read it when it imported ray
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ["RAY_agent_register_timeout_ms"] = "180000"  # noqa: SIM112 (Ray's own spelling)
    temp_dir = os.path.join(os.environ.get("RAY_TMPDIR", "/tmp"), "multinode")
    c = Cluster()
    session = f"session_multinode_{os.getpid()}"
    session_dir = os.path.join(temp_dir, session)
    nodes = {}
    try:
        nodes["head"] = add_node(
            c,
            session_dir,
            0,
            num_cpus=4,
            labels={"epp/host": "head"},
            gcs_server_port=GATEWAY_TEST_PORT + 390,
            ray_client_server_port=GATEWAY_TEST_PORT + 391,
            include_dashboard=False,
            temp_dir=temp_dir,
            session_name=session,
        )
        w1 = {"epp/host": "w1", "epp/profiles": "yes"}
        nodes["w1"] = add_worker_node(c, session_dir, 1, num_cpus=4, labels=w1)
        nodes["w2"] = add_worker_node(c, session_dir, 2, num_cpus=4, labels={"epp/host": "w2", "gpu": "l4"})
        ray.init(address=c.address, namespace="ray-epp-multinode", log_to_driver=False)
        for name in ("w1", "w2"):
            wait_for(lambda n=name: placed_on(nodes[n].node_id), 90, f"the head's scheduler to see {name}")
        yield c, {name: n.node_id for name, n in nodes.items()}, nodes
    finally:
        ray.shutdown()
        c.shutdown()


@pytest.fixture(scope="module")
def sim():
    from ray_epp.simulator import start_sim_pods_in_thread

    with start_sim_pods_in_thread(4, time_scale=1.0, seed=11) as pods:
        yield pods


def pods_for(sim, ids: dict[str, str]) -> list:
    """p0, p1 on w1 by node id; p2, p3 on w2 by its labels."""
    from actors.options import PodSpec

    out = []
    for i, p in enumerate(sim.pods):
        where = {"node": ids["w1"]} if i < 2 else {"node_labels": {"epp/host": "w2", "gpu": "l4"}}
        out.append(PodSpec(name=p.name, address="127.0.0.1", port=p.port, labels=p.labels, **where))
    return out


def options(name: str, **extra) -> dict:
    return {
        "datastore_name": name,
        "heartbeat_s": 0.1,
        "staleness_threshold_s": 1.0,
        "check_interval_s": 0.05,
        "watch_timeout_s": 1.0,
        "datastore_node_labels": {"epp/host": "head"},
        "profile_node_labels": {"epp/profiles": "yes"},
        **extra,
    }


@pytest.fixture(scope="module")
def epp(cluster, sim):
    from ray import serve

    from serve_app.cli.launch import EppDeployment, LaunchSpec

    c, ids, _ = cluster
    serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": PORT + 88})
    dep = EppDeployment.start(
        LaunchSpec(
            pods=pods_for(sim, ids),
            address=c.address,
            port=PORT,
            replicas=3,
            app_name=APP,
            actor_options=options(DATASTORE),
        )
    )
    try:
        yield dep
    finally:
        dep.stop()


def complete(client: httpx.Client, prompt: str = "hello there") -> httpx.Response:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 4}
    return client.post(f"http://127.0.0.1:{PORT}/v1/completions", json=body)


def test_actors_run_on_their_nodes(cluster, epp):
    from actors.placement import RayNodes

    _, ids, _ = cluster
    groups = ray.get(epp.actors.datastore.metrics_actor_groups.remote())
    assert {g: v["pods"] for g, v in groups.items()} == {
        f"node:{ids['w1']}": ["sim-0", "sim-1"],
        f"node:{ids['w2']}": ["sim-2", "sim-3"],
    }
    where = {group: actor_node(value["actor"]) for group, value in groups.items()}
    assert where == {group: group.removeprefix("node:") for group in groups}, (ids, where, RayNodes.of(ray.nodes()))
    assert actor_node(epp.actors.datastore) == ids["head"]
    (profile,) = epp.actors.profiles.values()
    assert actor_node(profile) == ids["w1"]
    replica_nodes = set(gateway_replicas().values())
    assert len(replica_nodes) > 1, replica_nodes
    assert replica_nodes - {ids["w1"]}, "a gateway replica on another node than the profile actor"
    with httpx.Client(timeout=30) as client:
        for i in range(12):
            resp = complete(client, f"request {i}")
            assert resp.status_code == 200, resp.text


@ray.remote(num_cpus=0)
class LinkProbe:
    """A gateway's link to a profile actor (serve_app/gateway/ray_runner.ActorLink), run on a chosen node."""

    async def run(self, profile) -> dict:
        import asyncio

        from actors.protocol import ProfileCall
        from scheduler import CycleState, LLMRequest
        from serve_app.gateway.ray_runner import ActorLink

        link = ActorLink(profile)
        names = []
        for i in range(3):  # the first call also asks for the channel; later ones use it if it is there
            request = LLMRequest(f"probe-{i}", MODEL, body={"model": MODEL, "prompt": "probe"})
            (outcome,) = await link.run_batch([ProfileCall(request, CycleState())])
            names.append(outcome.result.target_endpoints[0].name if outcome.result else outcome.error)
            await asyncio.sleep(0.3)
        return {"targets": names, "channel": link._client is not None}


def test_the_cross_node_path_is_ray_calls_and_works(cluster, epp):
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    _, ids, _ = cluster
    (profile,) = epp.actors.profiles.values()
    assert actor_node(profile) == ids["w1"]
    seen = {}
    for where in ("w2", "w1"):
        before = ray.get(profile.info.remote())["batches"]
        probe = LinkProbe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(ids[where], soft=False)).remote()
        seen[where] = ray.get(probe.run.remote(profile), timeout=60)
        after = ray.get(profile.info.remote())["batches"]
        seen[where]["by"] = {k: after[k] - before[k] for k in after}
        ray.kill(probe)
    # from w2 (another node): no channel, so its 3 batches were Ray calls, and the decisions are real
    # pods (the gateway replicas may send batches meanwhile too: at least, not exactly)
    assert seen["w2"]["channel"] is False and seen["w2"]["by"]["ray"] >= 3, seen
    assert all(str(t).startswith("sim-") for t in seen["w2"]["targets"]), seen
    # from w1 (the profile actor's node): the same-node channel takes over after the first call
    assert seen["w1"]["channel"] is True and seen["w1"]["by"]["channel"] >= 1, seen


def test_metrics_actor_scope_pod_puts_one_actor_per_pod_on_its_node(cluster, sim):
    from actors.launcher import start_epp_actors, stop_epp_actors
    from scheduler import load_config_file
    from serve_app.cli.launch import DEFAULT_CONFIG

    _, ids, _ = cluster
    actors = start_epp_actors(
        load_config_file(DEFAULT_CONFIG), pods_for(sim, ids), options=options("mn-perpod", metrics_actor_scope="pod")
    )
    try:
        groups = ray.get(actors.datastore.metrics_actor_groups.remote())
        assert {g: v["pods"] for g, v in groups.items()} == {f"pod:sim-{i}": [f"sim-{i}"] for i in range(4)}
        where = {g: actor_node(v["actor"]) for g, v in groups.items()}
        assert where == {
            "pod:sim-0": ids["w1"],
            "pod:sim-1": ids["w1"],
            "pod:sim-2": ids["w2"],
            "pod:sim-3": ids["w2"],
        }
        states = wait_for(
            lambda: (s := ray.get(actors.datastore.status.remote())) and all(p["state"] == "ready" for p in s) and s,
            30,
            "every pod ready",
        )
        assert len(states) == 4
    finally:
        stop_epp_actors(actors)


class Traffic:
    """4 threads, one request at a time each, every request with a 30 s timeout, until stopped
    (or 150 s): (monotonic time sent, monotonic time answered, outcome) for each, outcome "ok" or why
    it failed."""

    def __init__(self) -> None:
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
                    resp = complete(client, f"worker {worker} request {n}")
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


def test_losing_a_worker_node_under_traffic(cluster, epp, capsys):
    """w1 holds the profile actor, the metrics actor of p0/p1 and (Serve spreads them) a gateway
    replica. Remove it while 4 clients send requests; every failure is counted with its reason."""
    c, ids, nodes = cluster
    (profile,) = epp.actors.profiles.values()
    groups = ray.get(epp.actors.datastore.metrics_actor_groups.remote())
    w1_metrics = groups[f"node:{ids['w1']}"]["actor"]
    replicas_before = gateway_replicas()
    on_w1 = [a for a, n in replicas_before.items() if n == ids["w1"]]
    assert actor_node(profile) == ids["w1"] and actor_node(w1_metrics) == ids["w1"]
    assert on_w1, f"Serve put no gateway replica on w1: {replicas_before}"

    traffic = Traffic()
    time.sleep(3)
    removed_at = time.monotonic()
    c.remove_node(nodes["w1"], allow_graceful=False)
    try:
        # the replica is replaced (3 alive again, none on w1), the actors run again elsewhere
        replaced = lambda: len(r := gateway_replicas()) == 3 and ids["w1"] not in r.values()  # noqa: E731
        wait_for(replaced, 120, "Serve to replace the replica")
        wait_for(lambda: actor_state(profile) == "ALIVE" and actor_node(profile) != ids["w1"], 60, "the profile actor")
        wait_for(lambda: actor_state(w1_metrics) == "ALIVE", 60, "the metrics actor of w1's pods")
        recovered_at = time.monotonic()
        time.sleep(4)  # traffic after the recovery
    finally:
        results = traffic.finish()
    assert actor_node(w1_metrics) not in (ids["w1"], "")
    info = ray.get(profile.info.remote(), timeout=30)
    assert info["version"] > 0 and sorted(info["endpoints"]) == [f"sim-{i}" for i in range(4)], info
    status = ray.get(epp.actors.datastore.status.remote())
    assert all(p["state"] == "ready" for p in status), status  # p0/p1 are scraped again

    # A request in flight when the node went (or sent while it was being replaced) may fail with a
    # known reason, e.g. 503 once its profile call's 10 s bound runs out; one sent after the recovery
    # may not.
    before = [o for _, answered, o in results if answered < removed_at]
    after = [o for _, answered, o in results if answered >= removed_at]
    failed = Counter(o for o in after if o != "ok")
    tail = [o for sent, _, o in results if sent >= recovered_at + 1]
    with capsys.disabled():
        print(
            f"\nnode loss: {len(before)} requests before (all ok: {set(before) == {'ok'}}), {len(after)} after,"
            f" {sum(failed.values())} failed: {dict(failed)};"
            f" recovered {recovered_at - removed_at:.1f} s after the removal; {len(tail)} requests after it, all ok:"
            f" {set(tail) <= {'ok'}}"
        )
    assert set(before) == {"ok"}
    assert tail and set(tail) == {"ok"}, Counter(tail)
    known = ("connection broke", "connect refused", "503 ")
    assert all(reason.startswith(known) for reason in failed), failed
