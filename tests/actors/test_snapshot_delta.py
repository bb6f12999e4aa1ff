"""Snapshot deltas without Ray: a reader that applies every delta holds exactly the datastore's
pool, whatever came and went; readers too far behind, new or from another incarnation get the
whole pool; readers at the same version share one pickled answer."""

from __future__ import annotations

import pickle
import random

from actors.datastore_core import DatastoreCore
from actors.options import ActorOptions, PodSpec
from actors.pod_state import PodRecord, PodState
from actors.snapshot_delta import DeltaLog, PoolCopy
from scheduler import Endpoint, Metrics, ServedModel


def ep(name: str, queue: int = 0, labels: dict | None = None) -> Endpoint:
    return Endpoint(name, "10.0.0.1", 8000, labels or {}, Metrics(waiting_queue_size=queue))


def content(by_name: dict[str, Endpoint]) -> dict:
    return {n: (e.address, e.port, dict(e.labels), e.metrics) for n, e in by_name.items()}


def names(pool: PoolCopy) -> list[str]:
    return [e.name for e in pool.endpoints]


def test_a_reader_follows_changes_arrivals_and_departures():
    log, pool = DeltaLog(first_version=100), PoolCopy()
    a, b, c = ep("a"), ep("b"), ep("c")
    pool.apply(log.packed(0, 101, [a, b, c]))
    assert pool.version == 101 and names(pool) == ["a", "b", "c"]

    b2 = ep("b", queue=7)
    delta = pickle.loads(log.packed(101, 102, [a, b2, c]))
    assert not delta.full and [e.name for e in delta.endpoints] == ["b"] and delta.removed == []
    pool.apply(log.packed(101, 102, [a, b2, c]))
    assert pool.by_name["b"].metrics.waiting_queue_size == 7

    d = ep("d")
    delta = pickle.loads(log.packed(102, 103, [a, b2, d]))  # c leaves, d arrives
    assert [e.name for e in delta.endpoints] == ["d"] and delta.removed == ["c"]
    pool.apply(log.packed(102, 103, [a, b2, d]))
    assert names(pool) == ["a", "b", "d"]

    relabelled = Endpoint("a", "10.0.0.1", 8000, {"llm-d.ai/role": "decode"}, a.metrics)  # same metrics object
    pool.apply(log.packed(103, 104, [relabelled, b2, d]))
    assert pool.by_name["a"].labels == {"llm-d.ai/role": "decode"}


def test_random_histories_leave_every_reader_with_the_pool():
    rng = random.Random(5)
    log = DeltaLog(first_version=10, max_tombstones=8)
    readers = [PoolCopy() for _ in range(4)]
    current: dict[str, Endpoint] = {}
    version = 10
    for _ in range(300):
        version += rng.randint(1, 3)  # versions between reads collapse, as in the datastore
        for _ in range(rng.randint(0, 4)):
            name = f"p{rng.randint(0, 30)}"
            if name in current and rng.random() < 0.3:
                del current[name]
            else:
                current[name] = ep(name, queue=rng.randint(0, 9))
        snapshot = list(current.values())
        for reader in readers:
            if rng.random() < 0.6:  # some readers skip versions
                reader.apply(log.packed(reader.version, version, snapshot))
                assert content(reader.by_name) == content(current) and reader.version == version
    assert log.delta(readers[0].version).version == version


def test_old_or_foreign_readers_get_the_whole_pool():
    log = DeltaLog(first_version=1_000)
    pool = [ep("a"), ep("b")]
    log.learn(1_001, pool)
    assert log.delta(0).full  # a new reader
    assert log.delta(999).full  # a version of an earlier incarnation
    assert log.delta(5_000).full  # a version this log never published
    assert not log.delta(1_001).full and log.delta(1_001).endpoints == []


def test_forgotten_departures_move_the_horizon():
    log = DeltaLog(first_version=1, max_tombstones=2)
    pods = [ep(f"p{i}") for i in range(5)]
    log.learn(2, pods)
    for v, gone in enumerate(range(3), start=3):
        pods = [p for p in pods if p.name != f"p{gone}"]
        log.learn(v, pods)
    # three departures, two tombstones kept: a reader from before the first must start again
    assert log.delta(2).full
    assert not log.delta(3).full and log.delta(3).removed == ["p1", "p2"]


def test_readers_at_one_version_share_one_pickled_answer():
    log = DeltaLog(first_version=1)
    pods = [ep("a"), ep("b")]
    log.learn(2, pods)
    changed = [pods[0], ep("b", queue=3)]
    assert log.packed(2, 3, changed) is log.packed(2, 3, changed)
    assert log.packed(0, 3, changed) is not log.packed(2, 3, changed)


def test_a_delta_that_does_not_follow_the_readers_version_restarts_it():
    log, pool = DeltaLog(first_version=1), PoolCopy()
    pool.apply(log.packed(0, 2, [ep("a")]))
    log.learn(3, [ep("a", 1)])
    stray = log.packed(3, 4, [ep("a", 2)])  # from 3, but the reader holds 2
    assert pool.apply(stray) is None and pool.version == 0  # its next read asks for the whole pool


def test_a_pods_new_model_list_is_a_new_version_and_reaches_readers():
    core = DatastoreCore(ActorOptions())
    spec = PodSpec(name="a", address="10.0.0.1", port=8000)
    core.pods["a"] = PodRecord(spec, metrics=Metrics(), state=PodState.READY)
    log, pool = DeltaLog(first_version=core.version), PoolCopy()
    pool.apply(log.packed(0, *core.snapshot()))
    assert pool.by_name["a"].served_models is None  # not collected yet

    before = core.version
    core.report_models("a", [{"id": "base", "created": 1}, {"id": "lora", "parent": "base"}])
    assert core.version > before
    pool.apply(log.packed(pool.version, *core.snapshot()))
    assert pool.by_name["a"].served_models == (ServedModel("base"), ServedModel("lora", "base"))

    same = core.version
    core.report_models("a", [{"id": "lora", "parent": "base"}, {"id": "base", "created": 2}])  # same list
    assert core.version == same and core.models() == ["base", "lora"]


def test_pods_that_list_the_same_models_share_one_list():
    core = DatastoreCore(ActorOptions())
    for name in ("a", "b", "c"):
        spec = PodSpec(name=name, address="10.0.0.1", port=8000 + ord(name))
        core.pods[name] = PodRecord(spec, metrics=Metrics(), state=PodState.READY)
    core.report_models("a", [{"id": "base", "created": 1}])
    core.report_models("b", [{"id": "base", "created": 2}])  # the same list: vLLM stamps each answer
    core.report_models("c", [{"id": "base"}, {"id": "lora", "parent": "base"}])
    a, b, c = (core.pods[n].models for n in "abc")
    assert a is b and a != c  # one object: a snapshot pickles it once

