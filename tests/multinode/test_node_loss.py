"""Losing a Ray node under steady traffic, with profile standbys (docs/DESIGN.md, "Profile
standbys"), on the multi-node modules' cluster (tests/multinode/conftest.py): a head that runs no
actor (0 CPUs: Serve's controller and proxy, this driver) and three workers. The default profile's
actor and its standby are on two different workers (a STRICT_SPREAD placement group), the
datastore prefers w3, 4 simulated pods are assigned to the workers (p0, p3
to w1, p1 to w2, p2 to w3) and 2 gateway replicas share the port. The first test removes the
node of the profile's primary actor, the second then the node of the datastore; each stops the
pods assigned to the lost node with it (a pod dies with its machine).

No request may fail with a 503, a time-out or a refused connection. The one failure no server can
prevent, a request held by a gateway replica on the lost node itself (its connection breaks), is
allowed and counted apart: only for connections that broke before that replica's process exited
(here it outlives its node's raylet by a moment, as a dead machine's would not), and only when a
replica was on that node. What each removal measured (first routed answer, replacement times) is printed."""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from itertools import pairwise

import httpx
import pytest

from bench.local_cluster import actor_node, actor_state, gateway_replicas, wait_for
from tests.conftest import GATEWAY_TEST_PORT
from tests.multinode.nodes import Traffic

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.ray

PORT = GATEWAY_TEST_PORT + 300  # the gateway; Serve's proxy at +88; the nodes' own ports from +400
APP = "epp-node-loss"
WORKERS = ("w1", "w2", "w3")
HELD_BY_THE_LOST_REPLICA = "connection broke"


@pytest.fixture(scope="module")
def sim():
    from ray_epp.simulator import start_sim_pods_in_thread

    with start_sim_pods_in_thread(4, time_scale=1.0, seed=13) as pods:
        yield pods


def assigned(i: int) -> str:
    return WORKERS[i % 3]


@pytest.fixture(scope="module")
def epp(cluster, sim):
    from ray import serve

    from actors.options import PodSpec
    from serve_app.cli.launch import EppDeployment, LaunchSpec

    c, ids, _ = cluster
    pods = [
        PodSpec(name=p.name, address="127.0.0.1", port=p.port, labels=p.labels, node=ids[assigned(i)])
        for i, p in enumerate(sim.pods)
    ]
    options = {
        "datastore_name": "loss-datastore",
        "heartbeat_s": 0.1,
        "staleness_threshold_s": 1.0,
        "check_interval_s": 0.05,
        "watch_timeout_s": 1.0,
        "datastore_node_labels": {"epp/host": "w3"},
    }
    serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": PORT + 88})
    dep = EppDeployment.start(
        LaunchSpec(pods=pods, address=c.address, port=PORT, replicas=2, app_name=APP, actor_options=options)
    )
    try:
        yield dep
    finally:
        dep.stop()


def node_name(ids: dict[str, str], node_id: str) -> str:
    return next((name for name, i in ids.items() if i == node_id), node_id[:8])


def failure_counts() -> list[float]:
    """ray_epp_profile_actor_failures_total and _failovers_total from the gateway's /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"http://127.0.0.1:{PORT}/metrics", timeout=30).text
    sums = {f.name: sum(x.value for x in f.samples) for f in text_string_to_metric_families(text)}
    return [sums.get(f"ray_epp_profile_actor_{n}", 0.0) for n in ("failures", "failovers")]


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def metrics_actors_alive(datastore, lost: str) -> bool:
    """Every metrics actor the datastore has (it may have made new ones) runs, none on `lost`."""
    groups = ray.get(datastore.metrics_actor_groups.remote(), timeout=30)
    return all(actor_state(v["actor"]) == "ALIVE" and actor_node(v["actor"]) != lost for v in groups.values())


def lose_node(cluster, epp, sim, victim: str) -> dict:
    """Remove `victim` (and stop its pods) under traffic; wait until what ran there runs elsewhere.
    Returns what was measured; fails on any request failure but the lost replica's."""
    c, ids, nodes = cluster
    datastore = epp.actors.datastore
    pair = [epp.actors.shards["default"][0], epp.actors.standbys["default"][0]]
    replicas_on_victim = [a for a, n in gateway_replicas(APP).items() if n == ids[victim]]
    pids = [ray._private.state.actors(a)["Pid"] for a in replicas_on_victim]
    on_victim = {
        "datastore": actor_node(datastore) == ids[victim],
        "profile actors": [("primary", "standby")[k] for k, a in enumerate(pair) if actor_node(a) == ids[victim]],
        "gateway replicas": len(replicas_on_victim),
        "pods": [p.name for i, p in enumerate(sim.pods) if assigned(i) == victim],
    }
    batches = lambda: [sum(i["batches"].values()) for i in ray.get([a.info.remote() for a in pair], timeout=30)]  # noqa: E731
    batches_before = batches()
    traffic = Traffic(PORT)
    time.sleep(3)
    mirrored = [b - a for a, b in zip(batches_before, batches(), strict=True)]
    removed_at = time.monotonic()
    dying = [pod for i, pod in enumerate(sim.pods) if assigned(i) == victim]
    pods_stop = threading.Thread(target=lambda: [pod.stop() for pod in dying])  # they die with their node
    pods_stop.start()
    c.remove_node(nodes[victim], allow_graceful=False)
    removal_took = time.monotonic() - removed_at
    pods_stop.join(30)
    # Its replica's process outlives the raylet until it sees it gone (a dead machine's would not):
    # the connections it breaks until it exits are the ones it held.
    replica_gone_at = wait_for(lambda: all(not process_alive(p) for p in pids) and time.monotonic(), 30, "exit")
    took = {"remove_node returned": removal_took, "the lost replica's process exited": replica_gone_at - removed_at}
    try:
        alive = [w for w in WORKERS if w != victim and any(n.node_id == ids[w] for n in c.worker_nodes)]
        declared = lambda: not any(n["Alive"] for n in ray.nodes() if n["NodeID"] == ids[victim])  # noqa: E731
        wait_for(declared, 90, "Ray to declare the node dead")
        took["declared dead by Ray"] = time.monotonic() - removed_at
        replaced = lambda: len(r := gateway_replicas(APP)) == 2 and ids[victim] not in r.values()  # noqa: E731
        wait_for(replaced, 120, "Serve to replace the replica")
        took["gateway replicas"] = time.monotonic() - removed_at
        wait_for(lambda: actor_state(datastore) == "ALIVE" and actor_node(datastore) != ids[victim], 90, "datastore")
        wait_for(lambda: metrics_actors_alive(datastore, ids[victim]), 90, "the metrics actors")
        took["datastore, metrics actors"] = time.monotonic() - removed_at
        running = {p.name for i, p in enumerate(sim.pods) if assigned(i) in alive}
        ready = lambda: {p["name"] for p in ray.get(datastore.status.remote()) if p["state"] == "ready"}  # noqa: E731
        wait_for(lambda: running <= ready(), 60, f"pods {sorted(running)} ready")
        took["pods ready"] = time.monotonic() - removed_at
        if len(alive) >= 2:  # a node the survivor does not hold: the lost one is placed there
            back = lambda: all(actor_state(a) == "ALIVE" and actor_node(a) != ids[victim] for a in pair)  # noqa: E731
            wait_for(back, 90, "the lost profile actor back")
            took["profile pair whole"] = time.monotonic() - removed_at
        recovered_at = time.monotonic()
        time.sleep(3)  # traffic after the recovery
    finally:
        results = traffic.finish()
    before = [o for _, answered, o in results if answered < removed_at]
    after = [(sent, answered, o) for sent, answered, o in results if answered >= removed_at]
    held = [o for _, answered, o in after if o.startswith(HELD_BY_THE_LOST_REPLICA) and answered <= replica_gone_at]
    failed = Counter(o for sent, _, o in after if o != "ok") - Counter(held)
    sent_after = [(sent, answered, o) for sent, answered, o in after if sent >= removed_at]
    first_ok = min((answered for _, answered, o in sent_after if o == "ok"), default=None)
    window = [answered - sent for sent, answered, _ in sent_after if sent < removed_at + 5]
    oks = sorted(answered for _, answered, o in results if o == "ok" and removed_at - 1 <= answered <= recovered_at)
    gap = max((b - a for a, b in pairwise(oks)), default=None)
    return {
        "profile actor batches failed, failed over (all replicas, so far)": failure_counts(),
        "requests sent after the removal slower than 1 s": sum(1 for t, a, o in sent_after if o == "ok" and a - t > 1),
        "on the lost node": on_victim,
        "requests before": len(before),
        "batches to the primary, the standby before it": mirrored,
        "requests after": len(after),
        "failed": dict(failed),
        "held by the lost replica": len(held),
        "first answer routed after the removal (s)": None if first_ok is None else round(first_ok - removed_at, 2),
        "slowest request sent in the 5 s after (s)": round(max(window, default=0.0), 2),
        "slowest before (s)": round(max((b - a for a, b, o in results if b < removed_at), default=0.0), 2),
        "longest time without an answer, from 1 s before to the recovery (s)": gap and round(gap, 2),
        "replaced after (s)": {k: round(v, 1) for k, v in took.items()},
        "requests after the recovery": len([1 for sent, _, _ in results if sent >= recovered_at]),
        "_checks": (before, failed, held, replicas_on_victim, results, recovered_at),
    }


def check(out: dict, capsys) -> None:
    before, failed, held, replicas_on_victim, results, recovered_at = out.pop("_checks")
    with capsys.disabled():
        print(f"\nnode loss: {out}")
    assert before and set(before) == {"ok"}
    assert not failed, failed  # no 503, no time-out, no refused connection
    assert not held or replicas_on_victim, held  # only where a replica was lost
    tail = [o for sent, _, o in results if sent >= recovered_at]
    assert tail and set(tail) == {"ok"}, Counter(tail)
    assert out["first answer routed after the removal (s)"] is not None


def test_losing_the_node_of_a_profile_actor(cluster, epp, sim, capsys):
    _, ids, _ = cluster
    primary, standby = epp.actors.shards["default"][0], epp.actors.standbys["default"][0]
    where = node_name(ids, actor_node(primary))
    assert where in WORKERS and actor_node(standby) not in (ids["head"], ids[where]), (where, ids)
    check(lose_node(cluster, epp, sim, where), capsys)


def test_losing_the_node_of_the_datastore(cluster, epp, sim, capsys):
    _, ids, _ = cluster
    where = node_name(ids, actor_node(epp.actors.datastore))
    assert where in WORKERS, where
    check(lose_node(cluster, epp, sim, where), capsys)
