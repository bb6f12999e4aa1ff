"""Ray EPP on several Ray nodes of one machine: the multi-node modules' `ray.cluster_utils.Cluster`
(tests/multinode/conftest.py: a head that runs no actor and three workers, each with its own
labels), everything on 127.0.0.1.

The pods are simulator pods in this process, assigned to the workers by the pods-file fields
(`node`: a node id, `node_labels`: a label selector); the profile actors prefer w1
(`profile_node_labels`), the datastore w3 (`datastore_node_labels`); the gateway runs 3 replicas,
which Serve spreads over the nodes. The tests check where each actor runs (node ids), that a
gateway replica on another node than the profile actor schedules by Ray calls (not the same-node
channel), and both metrics-actor scopes. The profile actors run without standbys here
(`profile_standby: off`); a node's loss under traffic, with standbys: test_node_loss.py.

The multi-node modules run last (tests/conftest.py) and shut the session Ray down first: a driver
attaches to one cluster at a time."""

from __future__ import annotations

import httpx
import pytest

from bench.local_cluster import actor_node, gateway_replicas, wait_for
from tests.conftest import GATEWAY_TEST_PORT
from tests.multinode.nodes import MODEL, complete

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.ray

PORT = GATEWAY_TEST_PORT + 300  # the gateway; Serve's proxy at +88; the nodes' own ports from +400
APP = "epp-multinode"
DATASTORE = "mn-datastore"


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
        "datastore_node_labels": {"epp/host": "w3"},
        "profile_node_labels": {"epp/profiles": "yes"},
        "profile_standby": "off",
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
    assert actor_node(epp.actors.datastore) == ids["w3"]
    (profile,) = epp.actors.profiles.values()
    assert actor_node(profile) == ids["w1"]
    replica_nodes = set(gateway_replicas(APP).values())
    assert len(replica_nodes) > 1, replica_nodes
    assert replica_nodes - {ids["w1"]}, "a gateway replica on another node than the profile actor"
    with httpx.Client(timeout=30) as client:
        for i in range(12):
            resp = complete(client, PORT, f"request {i}")
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
