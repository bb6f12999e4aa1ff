"""Snapshot deltas: a reader of the datastore gets only what changed in the routable pool since the
version it holds, serialised once per (since, version) for every reader that asks alike.

A full snapshot costs the datastore one pickling of every pod per reader per version: with 1,000
pods, several readers and versions coming every few ms it is the datastore's first limit
(docs/SCALING.md, docs/BENCHMARKS.md "Snapshot fan-out"). A delta names the endpoints new or
changed since the reader's version and the names that left the pool; the pickled bytes are shared
by the readers that ask from the same version (most readers are at the previous one).

`DeltaLog` lives in the datastore (no Ray). It learns each snapshot it publishes and notes per pod
the version at which its endpoint last changed (a new metrics object or model list, address, port
or labels) and per departed pod the version it left. A reader whose version is older than what the log can
answer for (from before this datastore incarnation, or older than the oldest tombstone kept) gets
the full pool, as does a first read (version 0). `PoolCopy` is the reader's side: it applies
deltas to its copy and hands out the endpoint list in the datastore's order."""

from __future__ import annotations

import pickle
from dataclasses import dataclass

from scheduler import Endpoint

MAX_TOMBSTONES = 4096


@dataclass(slots=True)
class SnapshotDelta:
    """The pool at `version` relative to `since`: when `full`, `endpoints` is the whole pool;
    else the endpoints new or changed after `since`, and `removed` the names gone since."""

    version: int
    since: int
    full: bool
    endpoints: list[Endpoint]
    removed: list[str]


def _same(a: Endpoint, b: Endpoint) -> bool:
    return (
        a.metrics is b.metrics
        and a.served_models is b.served_models
        and a.address == b.address
        and a.port == b.port
        and a.labels == b.labels
    )


class DeltaLog:
    def __init__(self, first_version: int, max_tombstones: int = MAX_TOMBSTONES) -> None:
        self._horizon = first_version  # readers older than this get the full pool
        self._max_tombstones = max_tombstones
        self._version = -1
        self._current: dict[str, Endpoint] = {}
        self._changed_at: dict[str, int] = {}
        self._removed_at: dict[str, int] = {}
        self._packed: dict[int, bytes] = {}

    def learn(self, version: int, endpoints: list[Endpoint]) -> None:
        """The datastore publishes `endpoints` at `version` (a no-op for the version it knows)."""
        if version == self._version:
            return
        new = {ep.name: ep for ep in endpoints}
        for name, ep in new.items():
            old = self._current.get(name)
            if old is None or not _same(old, ep):
                self._changed_at[name] = version
            self._removed_at.pop(name, None)
        for name in self._current.keys() - new.keys():
            self._changed_at.pop(name, None)
            self._removed_at[name] = version
        while len(self._removed_at) > self._max_tombstones:  # forget the oldest departures
            name = next(iter(self._removed_at))
            self._horizon = max(self._horizon, self._removed_at.pop(name))
        self._current, self._version = new, version
        self._packed.clear()

    def delta(self, since: int) -> SnapshotDelta:
        if since < self._horizon or since > self._version or since <= 0:
            return SnapshotDelta(self._version, since, True, list(self._current.values()), [])
        changed = [self._current[n] for n, v in self._changed_at.items() if v > since]
        removed = [n for n, v in self._removed_at.items() if v > since]
        return SnapshotDelta(self._version, since, False, changed, removed)

    def packed(self, since: int, version: int, endpoints: list[Endpoint]) -> bytes:
        """The pickled delta from `since` to the snapshot (`version`, `endpoints`): pickled once
        for every reader that asks from the same version."""
        self.learn(version, endpoints)
        out = self._packed.get(since)
        if out is None:
            out = self._packed[since] = pickle.dumps(self.delta(since), protocol=pickle.HIGHEST_PROTOCOL)
        return out


class PoolCopy:
    """A reader's copy of the pool, kept by applying deltas."""

    def __init__(self) -> None:
        self.version = 0
        self.by_name: dict[str, Endpoint] = {}

    def apply(self, packed: bytes) -> SnapshotDelta | None:
        """Apply a pickled delta; returns it (with `endpoints` as sent) when the pool changed,
        None when it is the version already held."""
        delta: SnapshotDelta = pickle.loads(packed)
        if delta.version == self.version:
            return None
        if delta.full:
            self.by_name = {ep.name: ep for ep in delta.endpoints}
        elif delta.since != self.version:  # not ours (cannot happen with one reader loop): start again
            self.version = 0
            return None
        else:
            for name in delta.removed:
                self.by_name.pop(name, None)
            for ep in delta.endpoints:
                self.by_name[ep.name] = ep
        self.version = delta.version
        return delta

    @property
    def endpoints(self) -> list[Endpoint]:
        return list(self.by_name.values())
