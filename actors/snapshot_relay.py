"""The snapshot relay of a Ray node: one follower of the datastore per node, which serves that
node's readers (profile actors, gateway replicas) over the same-node channel.

A delivery costs the datastore a Ray call whatever it carries (docs/SCALING.md): with every reader
watching it, ~200 readers at 40 versions/s would need ~30 datastore cores. With relays the
datastore has one reader per node; the relay follows it with `watch_delta` like any reader, keeps
the pool (`PoolCopy`) and its own `DeltaLog` of the versions it saw, and answers its readers'
`watch_delta(since, timeout_s)` from them: the same pickled `SnapshotDelta`, pickled once per
version for every reader at that version, sent over a loopback socket (`actors/channel.py`, a
fraction of a Ray call's cost). The deltas it answers are the datastore's: a reader at a version
the relay never saw gets every change the relay logged after it, so nothing is missed, and a
reader from before the relay's first version gets the whole pool.

Life: the datastore creates a node's relay when the first reader there asks for it
(`DatastoreActor.relay_for`), named `<datastore>:relay:<node id>` and pinned to that node. Ray
restarts a relay that crashed; the datastore owns it, so it ends with the datastore (a restarted
datastore makes new ones on demand). Readers that lose their relay fall back to the datastore and
ask for it again (`actors/pool_feed.py`). While the datastore is down or holding its readers after
a restart, a relay keeps the pool it has, as readers do."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
from typing import Any

import ray
from ray.util.scheduling_strategies import In, NodeLabelSchedulingStrategy

from actors.channel import ChannelServer
from actors.placement import NODE_ID_LABEL, PLACED_MIN_CPUS
from actors.snapshot_delta import DeltaLog, PoolCopy, SnapshotDelta

log = logging.getLogger("ray_epp.actors.relay")


def relay_name(datastore_name: str, node_id: str) -> str:
    return f"{datastore_name}:relay:{node_id}"


def unchanged(version: int) -> bytes:
    """A delta that changes nothing (the reader keeps `version`): a relay's answer when it has
    nothing newer than the reader by the timeout."""
    return pickle.dumps(SnapshotDelta(version, version, False, [], []), protocol=pickle.HIGHEST_PROTOCOL)


class RelayedPool:
    """The relay's pool and delta log (no Ray): `take` a delta from the datastore, `answer` a
    reader's `since`."""

    def __init__(self) -> None:
        self.pool = PoolCopy()
        self._log: DeltaLog | None = None  # made at the first version: older readers get the whole pool

    @property
    def version(self) -> int:
        return self.pool.version

    def take(self, packed: bytes) -> bool:
        """Apply the datastore's delta; True when the pool moved to a new version."""
        if self.pool.apply(packed) is None:
            return False
        if self._log is None:
            self._log = DeltaLog(self.pool.version)
        self._log.learn(self.pool.version, self.pool.endpoints)
        return True

    def answer(self, since_version: int) -> bytes:
        """The pickled delta from `since_version` to the pool held; one that changes nothing when
        the reader is not behind."""
        if self._log is None or self.pool.version <= since_version:
            return unchanged(since_version)
        return self._log.packed(since_version, self.pool.version, self.pool.endpoints)


@ray.remote(max_restarts=-1)
class SnapshotRelay:
    """A node's follower of the datastore named `datastore_name`; see the module doc."""

    def __init__(self, datastore: Any, datastore_name: str, watch_timeout_s: float = 5.0) -> None:
        """`datastore`: its handle (the relay ends with it, so it never needs to look it up by
        name: a blocking GCS call on this event loop would stall every reader of the node)."""
        self._datastore_name = datastore_name
        self._watch_timeout_s = watch_timeout_s
        self._datastore = datastore
        self._pool = RelayedPool()
        self._changed = asyncio.Event()
        self._errors = 0
        self._error = ""
        self._deliveries = 0
        self._channel = ChannelServer(self._by_channel)
        loop = asyncio.get_running_loop()
        self._channel_started = loop.create_task(self._channel.start())
        self._follower = loop.create_task(self._follow())

    async def _follow(self) -> None:
        while True:
            try:
                packed = await self._datastore.watch_delta.remote(self._pool.version, self._watch_timeout_s)
                if self._pool.take(packed):
                    self._changed.set()
                    self._changed = asyncio.Event()
            except asyncio.CancelledError:
                raise
            except Exception as err:  # datastore restarting or gone: keep the pool, try again
                self._errors += 1
                self._error = f"{type(err).__name__}: {err}"
                log.debug("relay of %s: watch failed: %s", self._datastore_name, err)
                await asyncio.sleep(0.1)

    async def watch_delta(self, since_version: int, timeout_s: float) -> bytes:
        """As `DatastoreActor.watch_delta`: the pickled delta from `since_version` once the relay
        holds a newer version, or at `timeout_s` one that changes nothing."""
        if self._pool.version <= since_version:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    while self._pool.version <= since_version:
                        await self._changed.wait()
        self._deliveries += 1
        return self._pool.answer(since_version)

    async def _by_channel(self, request: tuple[int, float]) -> bytes:
        since_version, timeout_s = request
        return await self.watch_delta(since_version, timeout_s)

    async def channel_endpoint(self) -> dict[str, Any]:
        """Where readers on this node ask (the same-node channel)."""
        await self._channel_started
        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "port": self._channel.port,
            "token": self._channel.token,
        }

    async def info(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "version": self._pool.version,
            "pods": len(self._pool.pool.by_name),
            "deliveries": self._deliveries,
            "watch_errors": self._errors,
            "last_error": self._error,
        }


def start_relay(
    held: Any, datastore: Any, datastore_name: str, namespace: str, node_id: str, watch_timeout_s: float
) -> Any:
    """The relay of `node_id`: `held` (the handle its creator keeps) while it lives, else a live one
    of its name, else a new one pinned to that node, which the caller must keep: Ray ends an actor,
    named or not, once its creator holds no handle to it. Blocking GCS calls: run it in a thread."""
    name = relay_name(datastore_name, node_id)
    try:
        found = ray.get_actor(name, namespace=namespace)
    except ValueError:
        found = None
    if found is not None:
        return held if held is not None else found
    return SnapshotRelay.options(
        name=name,
        namespace=namespace,
        get_if_exists=True,
        num_cpus=PLACED_MIN_CPUS,  # an actor that asks for nothing is placed anywhere (actors/placement.py)
        scheduling_strategy=NodeLabelSchedulingStrategy({NODE_ID_LABEL: In(node_id)}),
    ).remote(datastore, datastore_name, watch_timeout_s)
