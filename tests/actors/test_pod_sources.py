"""Pod sources behind the datastore (actors/pod_source*.py): a watched pods file is reloaded on
change (add, remove, relabel) without a restart, an invalid file keeps the last good set and says
why, and a managed source's pods can not be changed behind its back. Real Ray, simulated pods."""

from __future__ import annotations

import time

import pytest
import ray
import yaml

from actors import PodSpec, start_epp_actors, stop_epp_actors
from actors.pod_source import PodConflict
from tests.actors.support import CONFIG, fast_options, wait_for

pytestmark = pytest.mark.ray


def write_pods(path, pods: list[dict]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(pods))
    tmp.replace(path)  # as editors and ConfigMap volumes do: a new file, renamed over the old


def entry(sim, i: int, **labels: str) -> dict:
    pod = sim.pods[i]
    return {"name": pod.name, "address": pod.address, "port": pod.port, "labels": {**pod.labels, **labels}}


def snapshot(epp) -> dict[str, dict[str, str]]:
    return {e.name: dict(e.labels) for e in ray.get(epp.datastore.snapshot.remote())[1]}


def pod_names(epp) -> set[str]:
    return {p["name"] for p in ray.get(epp.datastore.pods.remote())}


@pytest.fixture(scope="module")
def watching(ray_session, sim, tmp_path_factory):
    path = tmp_path_factory.mktemp("watch") / "pods.yaml"
    write_pods(path, [entry(sim, 0), entry(sim, 1)])
    epp = start_epp_actors(
        CONFIG,
        [],
        options=fast_options("t-watch", drain_settle_s=0.2),
        pod_sources=[{"kind": "file", "path": str(path), "interval_s": 0.1}],
    )
    yield epp, path
    stop_epp_actors(epp)


@pytest.fixture()
def watched(watching, sim):
    """The module's datastore, its file back at sim-0 and sim-1 (and nothing else) for each test."""
    epp, path = watching
    write_pods(path, [entry(sim, 0), entry(sim, 1)])
    for name in pod_names(epp) - {"sim-0", "sim-1"}:
        if name == "extra":
            ray.get(epp.datastore.remove_pod.remote(name))
    wait_for(lambda: pod_names(epp) == {"sim-0", "sim-1"}, what="the module's first pods")
    return epp, path


def test_a_watched_file_adds_removes_and_relabels_without_a_restart(watched, sim):
    epp, path = watched
    wait_for(lambda: set(snapshot(epp)) == {"sim-0", "sim-1"}, what="the file's first pods")
    pid = ray.get(epp.datastore.debug_info.remote())["pid"]
    [source] = ray.get(epp.datastore.sources.remote())
    assert source["ok"] and source["pods"] == 2 and source["last_error"] is None
    reloads = source["reloads"]

    write_pods(path, [entry(sim, 0), entry(sim, 1, tier="gold"), entry(sim, 2)])
    wait_for(lambda: set(snapshot(epp)) == {"sim-0", "sim-1", "sim-2"}, what="sim-2 added")
    wait_for(lambda: snapshot(epp)["sim-1"].get("tier") == "gold", what="sim-1 relabelled")

    write_pods(path, [entry(sim, 1, tier="gold"), entry(sim, 2)])
    wait_for(lambda: "sim-0" not in snapshot(epp), what="sim-0 out of the snapshot")
    wait_for(lambda: pod_names(epp) == {"sim-1", "sim-2"}, what="sim-0 drained and gone")  # idle: drains at once

    rows = {r["name"]: r for r in ray.get(epp.datastore.status.remote())}
    assert {r["source"] for r in rows.values()} == {f"file:{path.resolve()}"}
    assert ray.get(epp.datastore.debug_info.remote())["pid"] == pid  # no restart
    assert ray.get(epp.datastore.sources.remote())[0]["reloads"] == reloads + 2


@pytest.mark.parametrize(
    "bad, says",
    [
        ("- name: [unclosed\n", "not valid YAML"),
        ("- {name: x, address: 127.0.0.1, port: 99999}\n", "port"),
        ("- {name: x, address: 127.0.0.1, port: 1}\n- {name: x, address: 127.0.0.1, port: 2}\n", "earlier entry"),
    ],
)
def test_an_invalid_file_keeps_the_last_good_set_and_says_why(watched, sim, bad, says):
    epp, path = watched
    wait_for(lambda: set(snapshot(epp)) == {"sim-0", "sim-1"}, what="the file's first pods")
    path.write_text(bad)
    # A poll may catch the file half written (empty: another error, as true as this one); wait for
    # the error of the whole bad file.
    [source] = wait_for(
        lambda: [s for s in ray.get(epp.datastore.sources.remote()) if says in (s["last_error"] or "")],
        what=f"the error saying {says!r}",
    )
    assert not source["ok"] and source["pods"] == 2
    time.sleep(0.5)  # several polls later the pods are still there
    assert set(snapshot(epp)) == {"sim-0", "sim-1"}

    write_pods(path, [entry(sim, 2)])  # fixed: the new set applies, the error is gone
    wait_for(lambda: pod_names(epp) == {"sim-2"}, what="the fixed file's set")
    [source] = ray.get(epp.datastore.sources.remote())
    assert source["ok"] and source["last_error"] is None


def test_a_deleted_file_keeps_the_pods(watched):
    epp, path = watched
    wait_for(lambda: set(snapshot(epp)) == {"sim-0", "sim-1"}, what="the file's first pods")
    path.unlink()
    wait_for(lambda: "can not read" in (ray.get(epp.datastore.sources.remote())[0]["last_error"] or ""), what="error")
    assert set(snapshot(epp)) == {"sim-0", "sim-1"}


def test_the_files_pods_belong_to_it(watched, sim):
    epp, path = watched
    wait_for(lambda: set(snapshot(epp)) == {"sim-0", "sim-1"}, what="the file's first pods")
    with pytest.raises(PodConflict, match="belongs to pod source file:"):
        ray.get(epp.datastore.remove_pod.remote("sim-0", True))
    with pytest.raises(PodConflict):
        ray.get(epp.datastore.add_pod.remote(PodSpec(**entry(sim, 0, tier="x"))))
    # a run-time pod beside the file's: the file's next version leaves it alone
    ray.get(epp.datastore.add_pod.remote(PodSpec(**{**entry(sim, 2), "name": "extra"})))
    write_pods(path, [entry(sim, 1)])
    wait_for(lambda: pod_names(epp) == {"sim-1", "extra"}, what="sim-0 gone, extra kept")
    # and the file may not take a name the run-time API gave: it does not own it... it adopts it
    write_pods(path, [entry(sim, 1), {**entry(sim, 2), "name": "extra"}])
    wait_for(
        lambda: {r["name"]: r["source"] for r in ray.get(epp.datastore.status.remote())}.get("extra", "").startswith(
            "file:"
        ),
        what="extra adopted by the file",
    )


def test_the_drain_rules():
    from actors.options import ActorOptions
    from actors.pod_state import PodRecord, PodState
    from scheduler import Metrics

    opts = ActorOptions(drain_settle_s=0.5, drain_timeout_s=30.0, staleness_threshold_s=2.0)
    pod = PodRecord(PodSpec(name="p", address="127.0.0.1", port=1), metrics=Metrics(running_requests_size=1))
    pod.last_seen = now = 100.0
    assert pod.drained(now, opts) is None  # not draining
    pod.draining_since = now
    assert pod.health(now, opts) is PodState.DRAINING
    pod.metrics = Metrics()
    pod.note_drain_report(now + 0.1, opts)  # idle, but within the settle time: a request may still come
    assert pod.drained(now + 0.1, opts) is None
    pod.metrics = Metrics(waiting_queue_size=1)
    pod.note_drain_report(now + 0.6, opts)
    assert pod.drained(now + 0.6, opts) is None  # still has work
    pod.last_seen = now + 1.0
    pod.metrics = Metrics()
    pod.note_drain_report(now + 1.0, opts)
    assert pod.drained(now + 1.0, opts) == "idle"
    busy = PodRecord(pod.spec, metrics=Metrics(running_requests_size=3), last_seen=now, draining_since=now)
    assert busy.drained(now + 1.0, opts) is None
    assert busy.drained(now + 2.5, opts) == "stale"  # no report for longer than the staleness bound
    busy.last_seen = now + 29.0
    assert busy.drained(now + 30.0, opts) == "timeout"
