"""Where the datastore's pods come from: the pod source interface, and which source owns which pod.

A source produces whole pod sets; the datastore applies each one to the pods that source owns
(adding, replacing, draining what is gone) and leaves the others alone. Sources today:

* the static pods file: read once by the launcher, given to the datastore as its pod list (owner
  `static`); the run-time API may change it;
* the same file watched (`actors/pod_source_file.py`, owner `file:<path>`): reloaded on change, in
  the datastore's process, so it survives a datastore restart; an invalid file keeps the last good
  set and says why (`status()`);
* run-time add/remove (`DatastoreActor.add_pod` / `remove_pod`, the gateway's admin route, `epp pods`;
  owner `runtime`).

A *managed* source keeps owning its pods: nothing else may add, replace or remove a pod of that name
(`PodConflict`, the admin route's 409), and it re-runs when the datastore restarts. The static list
and run-time changes are unmanaged: either may change the other's pods. A Kubernetes source
(pods by label selector, docs/DESIGN.md) fits here as another managed source."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from typing import Any

from actors.options import PodSpec

STATIC = "static"  # the pod list the datastore was created with, and set_pods
RUNTIME = "runtime"  # add_pod / remove_pod

Publish = Callable[[list[PodSpec]], Awaitable[Any]]


class PodConflict(Exception):
    """A change to a pod that another (managed) source owns."""


class PodSource(ABC):
    """A source of pod sets. `run` publishes the whole set each time it changes (a first time as
    soon as it can) and returns only when the source has nothing more to say; `status` is what the
    admin route and `epp pods list` show."""

    managed: bool = True

    def __init__(self, source_id: str) -> None:
        self.id = source_id

    @abstractmethod
    async def run(self, publish: Publish) -> None: ...

    @abstractmethod
    def status(self) -> dict[str, Any]: ...


