"""A datastore restart under load must never make a ready pool look empty: real Ray, the datastore
killed (and restarted by Ray) while profile calls and snapshot watches flow."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

pytestmark = pytest.mark.ray

ray = pytest.importorskip("ray")

from actors import ProfileCall, start_epp_actors, stop_epp_actors  # noqa: E402
from scheduler import CycleState  # noqa: E402
from tests.actors.support import BLOCKS, CONFIG, fast_options, pod_specs, request, wait_for  # noqa: E402

KILLS = 3


@ray.remote
class SnapshotReader:
    """Follows the datastore as the readers do (gateway's EndpointView, profile actors' watch loop):
    long-polls `watch`, adopts every new version, keeps its last snapshot when a call fails. Records
    the size of every snapshot it adopted."""

    def __init__(self, datastore_name: str, namespace: str) -> None:
        self._name, self._namespace = datastore_name, namespace
        self._version = 0
        self._sizes: list[tuple[int, int]] = []  # (version, number of endpoints)
        self._errors = 0
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def _loop(self) -> None:
        datastore = None
        while True:
            try:
                if datastore is None:
                    datastore = ray.get_actor(self._name, namespace=self._namespace)
                version, endpoints = await datastore.watch.remote(self._version, 1.0)
                if version != self._version:
                    self._version = version
                    self._sizes.append((version, len(endpoints)))
            except Exception:  # restarting: keep the last snapshot, look the actor up again
                self._errors += 1
                datastore = None
                await asyncio.sleep(0.05)

    async def seen(self) -> dict:
        return {"sizes": list(self._sizes), "errors": self._errors}


def test_a_datastore_restart_never_publishes_an_empty_pool(ray_session, sim):
    # staleness well above the hold expected (about a scrape interval), to tell the two apart
    epp = start_epp_actors(CONFIG, pod_specs(sim), options=fast_options("t-restart", staleness_threshold_s=3.0))
    profile = epp.profiles["default"]
    reader = SnapshotReader.remote("t-restart", epp.namespace)
    stop = threading.Event()
    outcomes: list[tuple[float, str | None]] = []  # (time, error message or None)

    def calls() -> None:
        i = 0
        while not stop.is_set():
            i += 1
            try:
                [outcome] = ray.get(profile.run_batch.remote([ProfileCall(request(i), CycleState())]), timeout=10)
            except Exception as err:  # not expected: the profile actor is never killed here
                outcomes.append((time.monotonic(), f"call failed: {err}"))
                continue
            outcomes.append((time.monotonic(), None if outcome.error is None else outcome.error.message))
            time.sleep(0.005)

    caller = threading.Thread(target=calls, daemon=True)
    try:
        wait_for(lambda: ray.get(reader.seen.remote())["sizes"], what="the reader's first snapshot")
        caller.start()
        pids, holds = set(), []
        for _ in range(KILLS):
            time.sleep(0.5)
            pid = ray.get(epp.datastore.debug_info.remote())["pid"]
            pids.add(pid)
            ray.kill(epp.datastore, no_restart=False)
            wait_for(
                lambda pid=pid: (_info(epp.datastore) or {}).get("pid") not in (None, pid),
                timeout=30,
                what="the restarted datastore",
            )
            wait_for(
                lambda: _names(epp) == set(BLOCKS),
                timeout=15,
                what="every pod routable again",
            )
            holds.append(ray.get(epp.datastore.debug_info.remote())["restart_hold_s"])
        time.sleep(0.5)
    finally:
        stop.set()
        caller.join(timeout=15)
        seen = ray.get(reader.seen.remote())
        ray.kill(reader, no_restart=True)
        stop_epp_actors(epp)

    assert len(pids) == KILLS and seen["errors"] > 0  # three new processes; the reader did lose the datastore
    empty = [v for v, n in seen["sizes"] if n == 0]
    assert not empty, f"the reader adopted {len(empty)} empty snapshots of {len(seen['sizes'])}: {seen['sizes']}"
    errors = [message for _, message in outcomes if message is not None]
    assert len(outcomes) > 50 and not errors, f"{len(errors)} failed of {len(outcomes)}: {sorted(set(errors))}"
    # each restart held the readers until the pods had reported again (a scrape), not until the bound
    assert all(h is not None and h < 0.5 for h in holds), holds


def _info(datastore) -> dict | None:
    try:
        return ray.get(datastore.debug_info.remote(), timeout=5)
    except Exception:
        return None


def test_a_pod_that_never_reports_holds_readers_back_only_until_it_would_be_stale(ray_session, sim):
    options = fast_options("t-restart-silent", staleness_threshold_s=1.5)
    epp = start_epp_actors(CONFIG, pod_specs(sim)[:2], options=options)
    try:
        actor = ray.get(epp.datastore.metrics_actors.remote())["sim-1"]
        ray.get(actor.stop.remote("sim-1"))  # its metrics actor lives on, but says nothing of sim-1
        wait_for(lambda: _names(epp) == {"sim-0"}, what="sim-1 stale")
        pid = ray.get(epp.datastore.debug_info.remote())["pid"]
        ray.kill(epp.datastore, no_restart=False)
        wait_for(lambda: (_info(epp.datastore) or {}).get("pid") not in (None, pid), timeout=30, what="restart")
        back = time.monotonic()
        assert _names(epp) == {"sim-0"}  # the pod that reports is served...
        assert time.monotonic() - back < 1.5 + 5.0
        # ...once the silent one would be stale: the datastore held its readers for it (its own
        # clock: the test may notice the restart late on a busy machine), but not for ever.
        held = ray.get(epp.datastore.debug_info.remote())["restart_hold_s"]
        assert held is not None and 1.0 < held < 1.5 + 1.0, held
        rows = {r["name"]: r for r in ray.get(epp.datastore.status.remote())}
        assert rows["sim-1"]["reports"] == 0 and rows["sim-0"]["state"] == "ready"
    finally:
        stop_epp_actors(epp)


def _names(epp) -> set[str]:
    return {e.name for e in ray.get(epp.datastore.snapshot.remote(), timeout=15)[1]}
