"""Where a reader of the pool (a profile actor, a gateway replica's view) gets its next snapshot
delta: its node's snapshot relay over the same-node channel when the datastore runs relays
(`snapshot_relays`, actors/snapshot_relay.py), else the datastore itself.

The reader asks the datastore for its node's relay once (`relay_for`; None when relays are off),
learns the relay's channel from it, and from then on long-polls the relay over the channel (the
search runs beside the reads: until it connects, the datastore serves them). When
the relay is lost (its connection closes, it does not answer within the watch timeout plus a
margin, it turns out to be on another node) the reader falls back to the datastore at once, for
that call and the ones after, and asks for its relay again after `retry_s` (the datastore
replaces a relay that died). Either path answers the same pickled `SnapshotDelta`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import ray

from actors.channel import ChannelClient

log = logging.getLogger("ray_epp.actors.pool_feed")

# How long a relay may take beyond the watch timeout before the reader gives up on it.
RELAY_MARGIN_S = 2.0
RETRY_S = 1.0


class PoolFeed:
    def __init__(self, node_id: str | None = None, retry_s: float = RETRY_S) -> None:
        """`node_id`: the relay to follow (default: this process's node; benchmarks name others)."""
        self._node_id = node_id
        self._retry_s = retry_s
        self._client: ChannelClient | None = None
        self._relays_off = False
        self._next_try = 0.0
        self._search: asyncio.Task | None = None
        self.source = "datastore"  # where the last delta came from: "relay" or "datastore"
        self.relay_losses = 0
        self.error = ""  # why the last attempt to reach the relay failed (for info and tests)

    async def next(self, datastore: Any, since_version: int, timeout_s: float) -> bytes:
        """The pickled delta from `since_version` (waiting up to `timeout_s` for a newer version)."""
        client = await self._relay(datastore)
        if client is not None:
            try:
                async with asyncio.timeout(timeout_s + RELAY_MARGIN_S):
                    packed = await client.request((since_version, timeout_s))
                self.source = "relay"
                return packed
            except (ConnectionError, OSError, TimeoutError) as err:
                self._lose(f"{type(err).__name__}: {err}")
        self.source = "datastore"
        return await datastore.watch_delta.remote(since_version, timeout_s)

    async def _relay(self, datastore: Any) -> ChannelClient | None:
        """The relay's channel when connected; else None (the datastore serves this call) after
        starting a search in the background, so a reader never waits for a relay to start."""
        if self._client is not None and not self._client.closed:
            return self._client
        if self._client is not None:
            self._lose("its channel closed")
        searching = self._search is not None and not self._search.done()
        if not (self._relays_off or searching or time.monotonic() < self._next_try):
            self._next_try = time.monotonic() + self._retry_s
            self._search = asyncio.get_running_loop().create_task(self._find(datastore))
        return None

    async def _find(self, datastore: Any) -> None:
        node_id = self._node_id or ray.get_runtime_context().get_node_id()
        try:
            relay = await datastore.relay_for.remote(node_id)
            if relay is None:
                self._relays_off = True
                return
            endpoint = await relay.channel_endpoint.remote()
            if endpoint["node_id"] != ray.get_runtime_context().get_node_id():
                self.error = f"the relay of node {node_id} runs on node {endpoint['node_id']}"
                return  # not on this node: the channel is loopback only
            client = ChannelClient(endpoint["port"], endpoint["token"])
            await client.connect()
        except Exception as err:  # the datastore or the relay is not there yet: the datastore serves
            self.error = f"{type(err).__name__}: {err}"
            log.debug("no snapshot relay for node %s yet: %s", node_id, err)
            return
        self._client = client

    def _lose(self, why: str) -> None:
        self.error = why
        if self._client is not None:
            client, self._client = self._client, None
            self.relay_losses += 1
            log.warning("snapshot relay lost (%s): reading from the datastore until it is back", why)
            with contextlib.suppress(RuntimeError):  # no running loop: nothing to close
                asyncio.get_running_loop().create_task(client.close())
        self._next_try = time.monotonic() + self._retry_s

    def datastore_changed(self) -> None:
        """The datastore was looked up again (restarted, re-created): ask it for relays anew."""
        self._relays_off = False
        self._next_try = 0.0

    async def close(self) -> None:
        if self._search is not None:
            self._search.cancel()
        if self._client is not None:
            await self._client.close()
            self._client = None
