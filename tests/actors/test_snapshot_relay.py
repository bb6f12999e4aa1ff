"""The snapshot relay per node: readers on a node follow the datastore through its relay over the
same-node channel; a relay that dies sends them back to the datastore until it is replaced.
Real Ray, real simulated pods, the real reader code (`PoolFeed` + `PoolCopy`)."""

from __future__ import annotations

import asyncio

import pytest

pytestmark = pytest.mark.ray

ray = pytest.importorskip("ray")

from actors import ProfileCall, start_epp_actors, stop_epp_actors  # noqa: E402
from actors.pool_feed import PoolFeed  # noqa: E402
from actors.snapshot_delta import PoolCopy  # noqa: E402
from actors.snapshot_relay import relay_name  # noqa: E402
from scheduler import CycleState  # noqa: E402
from tests.actors.support import CONFIG, fast_options, pod_specs, request, wait_for  # noqa: E402


@ray.remote(num_cpus=0)
class FeedReader:
    """Follows the pool as profile actors and gateway views do; counts where each version came from."""

    def __init__(self, datastore_name: str, namespace: str) -> None:
        self._feed = PoolFeed(retry_s=0.2)
        self._pool = PoolCopy()
        self._from = {"relay": 0, "datastore": 0}
        self._name, self._namespace = datastore_name, namespace
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def _loop(self) -> None:
        datastore = ray.get_actor(self._name, namespace=self._namespace)
        while True:
            packed = await self._feed.next(datastore, self._pool.version, 1.0)
            if self._pool.apply(packed) is not None:
                self._from[self._feed.source] += 1

    async def state(self) -> dict:
        """Versions taken from each source so far, the pool's names, relay losses, the last error."""
        feed = self._feed
        return {
            "taken": dict(self._from),
            "names": sorted(self._pool.by_name),
            "losses": feed.relay_losses,
            "error": feed.error,
        }


def test_readers_follow_their_nodes_relay_and_fall_back_when_it_dies(ray_session, sim):
    name = "t-relay"
    epp = start_epp_actors(CONFIG, pod_specs(sim), options=fast_options(name, snapshot_relays=True), timeout_s=120)
    try:
        node = ray.get_runtime_context().get_node_id()
        relay = wait_for(lambda: _relay(name, epp.namespace, node), what="the node's relay")
        reader = FeedReader.remote(name, epp.namespace)
        pods = sorted(p.name for p in sim.pods)

        # Every version comes from the relay once the reader found it, and the pool is the datastore's.
        taken = lambda: ray.get(reader.state.remote())["taken"]  # noqa: E731
        try:
            wait_for(lambda: taken()["relay"] >= 3, 60, what="versions from the relay")
        except AssertionError as err:
            raise AssertionError(f"{err}: {ray.get(reader.state.remote())}, {ray.get(relay.info.remote())}") from None
        before = taken()
        wait_for(lambda: taken()["relay"] >= before["relay"] + 5, 60, what="more versions from the relay")
        state = ray.get(reader.state.remote())
        assert state["taken"]["datastore"] == before["datastore"] and state["names"] == pods, state
        assert ray.get(relay.info.remote())["deliveries"] > 0
        _, snapshot = ray.get(epp.datastore.snapshot.remote())
        assert sorted(ep.name for ep in snapshot) == pods

        # The relay dies: the reader takes versions from the datastore, then from a new relay.
        old = relay._actor_id
        ray.kill(relay, no_restart=True)
        wait_for(lambda: ray.get(reader.state.remote())["losses"] >= 1, 60, what="the reader noticing")
        new = wait_for(lambda: _relay(name, epp.namespace, node, not_id=old), 60, what="a new relay")
        after = taken()
        wait_for(lambda: taken()["relay"] >= after["relay"] + 3, 60, what="versions from the new relay")
        assert taken()["datastore"] > before["datastore"]  # meanwhile, from the datastore
        assert ray.get(reader.state.remote())["names"] == pods
        assert ray.get(new.info.remote())["deliveries"] > 0

        # The profile actor, a reader of the same node, still decides on the whole pool.
        outcome = ray.get(epp.profiles["default"].run_batch.remote([ProfileCall(request(1), CycleState())]))[0]
        assert outcome.error is None and outcome.result.target_endpoints[0].name in pods
        ray.kill(reader, no_restart=True)
    finally:
        stop_epp_actors(epp)


def test_without_relays_the_datastore_serves_and_none_is_started(ray_session, sim):
    name = "t-relay-off"
    epp = start_epp_actors(CONFIG, pod_specs(sim), options=fast_options(name), timeout_s=120)
    try:
        node = ray.get_runtime_context().get_node_id()
        assert ray.get(epp.datastore.relay_for.remote(node)) is None
        reader = FeedReader.remote(name, epp.namespace)
        wait_for(
            lambda: ray.get(reader.state.remote())["taken"]["datastore"] >= 2, 60, what="versions from the datastore"
        )
        assert _relay(name, epp.namespace, node) is None
        ray.kill(reader, no_restart=True)
    finally:
        stop_epp_actors(epp)


def _relay(datastore_name: str, namespace: str, node: str, not_id=None):
    try:
        relay = ray.get_actor(relay_name(datastore_name, node), namespace=namespace)
    except ValueError:
        return None
    return None if relay._actor_id == not_id else relay
