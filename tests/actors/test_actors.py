"""The EPP actors on a real local Ray, scraping simulated vLLM pods over HTTP on 127.0.0.1."""

from __future__ import annotations

import time
import urllib.request

import pytest

pytestmark = pytest.mark.ray

ray = pytest.importorskip("ray")

from actors import PodSpec, ProfileCall, start_epp_actors, stop_epp_actors  # noqa: E402
from actors.launcher import profile_actor_name  # noqa: E402
from actors.metrics_groups import metrics_actor_name, pod_node  # noqa: E402
from actors.placement import NODE_ID_LABEL, RayNodes, affinity  # noqa: E402
from actors.protocol import ProfileEvent  # noqa: E402
from scheduler import (  # noqa: E402
    CycleState,
    ErrorCode,
    Scheduler,
    SchedulingResult,
    SchedulingTrace,
    load_config,
)
from scheduler.admission import admission_detectors, pool_saturated  # noqa: E402
from scheduler.lifecycle import LifecycleEvent  # noqa: E402
from tests.actors import plugins_for_tests  # noqa: E402, F401  (registers the test plugins here too)
from tests.actors.support import BLOCKS, CONFIG, MODEL, fast_options, pod_specs, request, wait_for  # noqa: E402

# Two profiles that each take >= 60 ms per call; "b" also filters every endpoint out (it fails).
TWO_PROFILES = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: all-profiles-handler
- name: slow
  type: test-sleep-filter
  parameters: {sleepMs: 60}
- name: nobody
  type: label-selector-filter
  parameters: {matchLabels: {role: none}}
- type: queue-scorer
- type: test-learned-scorer
- type: max-score-picker
schedulingProfiles:
- name: a
  plugins:
  - pluginRef: slow
  - pluginRef: queue-scorer
  - pluginRef: test-learned-scorer
  - pluginRef: max-score-picker
- name: b
  plugins: [{pluginRef: slow}, {pluginRef: nobody}, {pluginRef: max-score-picker}]
"""


def status_of(epp, name: str) -> dict:
    return next(row for row in ray.get(epp.datastore.status.remote()) if row["name"] == name)


def snapshot_names(epp) -> set[str]:
    return {e.name for e in ray.get(epp.datastore.snapshot.remote())[1]}


def named_actors(prefix: str) -> set[str]:
    return {a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith(prefix)}


@pytest.fixture(scope="module")
def epp(ray_session, sim):
    actors = start_epp_actors(CONFIG, pod_specs(sim), options=fast_options("t-main"))
    yield actors
    stop_epp_actors(actors)


def test_metrics_flow_from_pods_to_datastore_and_profile_actor(epp, sim):
    # start_epp_actors returned after the first scrape of every pod: all are routable now
    version, endpoints = ray.get(epp.datastore.snapshot.remote())
    rows = ray.get(epp.datastore.status.remote())
    assert {e.name: e.metrics.cache_num_blocks for e in endpoints} == BLOCKS, [
        (r["state"], r["reports"], r["last_update_age_s"], r["last_error"]) for r in rows
    ]
    by_name = {e.name: e for e in endpoints}
    assert by_name["sim-0"].metrics.max_active_models == 2  # vllm:lora_requests_info{max_lora="2"}
    assert by_name["sim-1"].metrics.cache_block_size == 16
    assert by_name["sim-1"].port == sim.pods[1].port
    assert by_name["sim-0"].metrics.update_time > time.time() - 60

    info = ray.get(epp.profiles["default"].info.remote())
    assert info["version"] >= version and set(info["endpoints"]) == set(BLOCKS)
    wait_for(lambda: ray.get(epp.datastore.models.remote()) == [MODEL], what="served models")
    rows = ray.get(epp.datastore.status.remote())
    assert {r["state"] for r in rows} == {"ready"} and all(r["served_models"] == [MODEL] for r in rows)

    # load on sim-1 shows up in the snapshot (reported on change, not at the next heartbeat only)
    body = b'{"model": "%s", "prompt": "hi", "max_tokens": 400, "stream": true}' % MODEL.encode()
    streams = []
    for _ in range(3):
        req = urllib.request.Request(sim.pods[1].url + "/v1/completions", data=body, method="POST")
        req.add_header("Content-Type", "application/json")
        streams.append(urllib.request.urlopen(req, timeout=10))
    try:
        wait_for(
            lambda: any(
                e.name == "sim-1" and e.metrics.running_requests_size > 0
                for e in ray.get(epp.datastore.snapshot.remote())[1]
            ),
            timeout=5,
            what="running requests of sim-1 in the snapshot",
        )
    finally:
        for s in streams:
            s.close()

    actor = ray.get(epp.datastore.metrics_actors.remote())["sim-0"]
    # the count grows with time, not with this test's steps: wait for a few scrapes, don't race them
    wait_for(lambda: ray.get(actor.stats.remote("sim-0"))["scrapes"] > 3, timeout=10, what="4 scrapes of sim-0")
    stats = ray.get(actor.stats.remote("sim-0"))
    assert stats["engine"] == "vllm" and stats["failures"] == 0
    assert stats["reports"] < stats["scrapes"]  # idle pod: reported on change and heartbeat only
    assert stats["parse_skips"] > 0  # an unchanged page is not parsed again


def test_idle_pods_metrics_stay_fresh_for_readers(epp):
    # Nothing changes on idle pods, yet with heartbeat_s=0.1 readers see an update_time younger than
    # utilization-detector's 200 ms line (it counts an endpoint with older metrics as saturated):
    # every heartbeat is a new snapshot version.
    detectors = admission_detectors([])
    ages, saturated = [], 0
    for _ in range(30):
        endpoints = ray.get(epp.datastore.snapshot.remote())[1]
        now = time.time()
        assert {e.name for e in endpoints} == set(BLOCKS)
        ages.extend(now - e.metrics.update_time for e in endpoints)
        saturated += pool_saturated(detectors, endpoints)
        time.sleep(0.05)
    ages.sort()
    assert ages[len(ages) // 2] < 0.15 and ages[int(len(ages) * 0.9)] < 0.2, ages
    assert saturated <= 3, f"the idle pool looked saturated in {saturated} of 30 samples (ages {ages})"


def test_one_metrics_actor_scrapes_the_nodes_pods_and_reports_in_batches(epp):
    groups = ray.get(epp.datastore.metrics_actor_groups.remote())
    assert [g["pods"] for g in groups.values()] == [sorted(BLOCKS)]  # all pods are on this node
    [(group, entry)] = groups.items()
    assert named_actors("t-main:metrics:") == {metrics_actor_name("t-main", group)}
    before = ray.get(entry["actor"].stats.remote())
    time.sleep(1.0)  # idle pods: heartbeats every 0.1 s, the three pods' together
    after = ray.get(entry["actor"].stats.remote())
    assert after["pods"] == sorted(BLOCKS) and after["scrapes"] - before["scrapes"] >= 3 * 10
    reports, calls = after["reports"] - before["reports"], after["report_calls"] - before["report_calls"]
    assert reports >= 3 * 3 and calls <= reports / 2, (reports, calls)
    with pytest.raises(ray.exceptions.RayTaskError, match="does not scrape pod 'nope'"):
        ray.get(entry["actor"].stats.remote("nope"))


def test_failing_pod_goes_unhealthy_then_recovers(epp, sim):
    pod = sim.pods[2]
    pod.set_failures({"metrics_garbage_rate": 1.0})
    try:
        wait_for(lambda: status_of(epp, "sim-2")["state"] == "unhealthy", what="sim-2 unhealthy")
        assert "sim-2" not in snapshot_names(epp)
        row = status_of(epp, "sim-2")
        assert row["consecutive_failures"] >= 3 and "bad metrics" in row["last_error"]
        info = wait_for(
            lambda: (i := ray.get(epp.profiles["default"].info.remote())) and "sim-2" not in i["endpoints"] and i,
            what="profile snapshot without sim-2",
        )
        assert set(info["endpoints"]) == {"sim-0", "sim-1"}
    finally:
        pod.set_failures({})
    wait_for(lambda: "sim-2" in snapshot_names(epp), what="sim-2 back in the snapshot")
    assert status_of(epp, "sim-2")["consecutive_failures"] == 0


def test_slow_pod_times_out_and_silent_pod_goes_stale(epp, sim):
    pod = sim.pods[1]
    pod.set_failures({"metrics_delay_s": 1.0})  # > scrape_timeout_s
    try:
        wait_for(lambda: status_of(epp, "sim-1")["state"] == "unhealthy", what="sim-1 unhealthy by timeouts")
        assert "timed out" in status_of(epp, "sim-1")["last_error"]
    finally:
        pod.set_failures({})
    wait_for(lambda: status_of(epp, "sim-1")["state"] == "ready", what="sim-1 ready again")

    # a metrics actor that stops reporting: the periodic check marks the pod stale
    actor = ray.get(epp.datastore.metrics_actors.remote())["sim-0"]
    assert ray.get(actor.stop.remote("sim-0")) is True
    try:
        wait_for(lambda: status_of(epp, "sim-0")["state"] == "stale", what="sim-0 stale")
        assert "sim-0" not in snapshot_names(epp)
        assert status_of(epp, "sim-1")["state"] == "ready"  # the same actor's other pods go on
    finally:
        ray.get(actor.start.remote("sim-0"))
    wait_for(lambda: "sim-0" in snapshot_names(epp), what="sim-0 re-admitted")


def test_when_every_pod_is_only_stale_the_pool_stays_routable_on_last_metrics(epp, sim):
    """A crashed metrics actor silences all its node's pods at once: the pool must not empty (503
    for every request until Ray restarts the actor, 103 failures in the soak) but route on the
    last metrics, as GIE does. Unhealthy pods stay out (test_slow_pod_... and the 503 tests)."""
    actors = ray.get(epp.datastore.metrics_actors.remote())
    names = sorted(actors)
    for name in names:
        assert ray.get(actors[name].stop.remote(name)) is True
    try:
        wait_for(lambda: {status_of(epp, n)["state"] for n in names} == {"stale"}, what="every pod stale")
        assert snapshot_names(epp) == set(names)
    finally:
        for name in names:
            ray.get(actors[name].start.remote(name))
    wait_for(lambda: {status_of(epp, n)["state"] for n in names} == {"ready"}, what="every pod ready again")
    assert snapshot_names(epp) == set(names)


def test_add_and_remove_pods_at_run_time(epp, sim):
    before = ray.get(epp.datastore.version.remote())
    extra = PodSpec(name="extra", address=sim.pods[0].address, port=sim.pods[0].port, labels={"x": "1"})
    added = ray.get(epp.datastore.add_pod.remote(extra))
    assert added == {"added": ["extra"], "removed": [], "replaced": [], "draining": []}
    wait_for(lambda: "extra" in snapshot_names(epp), what="extra in the snapshot")
    assert ray.get(epp.datastore.version.remote()) > before
    actor = ray.get(epp.datastore.metrics_actors.remote())["extra"]
    assert "extra" in ray.get(actor.stats.remote())["pods"]  # the node's metrics actor took it on
    wait_for(lambda: "extra" in ray.get(epp.profiles["default"].info.remote())["endpoints"], what="profile sees extra")

    # the same name with other labels: the pod is replaced (a new metrics actor under the same name)
    relabelled = extra.model_copy(update={"labels": {"x": "2"}})
    assert ray.get(epp.datastore.add_pod.remote(relabelled))["replaced"] == ["extra"]
    wait_for(
        lambda: any(e.name == "extra" and e.labels == {"x": "2"} for e in ray.get(epp.datastore.snapshot.remote())[1]),
        what="relabelled extra in the snapshot",
    )

    assert ray.get(epp.datastore.remove_pod.remote("extra")) is True
    assert "extra" not in snapshot_names(epp)
    assert "extra" not in ray.get(actor.stats.remote())["pods"]
    assert ray.get(epp.datastore.remove_pod.remote("extra")) is False
    with pytest.raises(ray.exceptions.RayTaskError, match="unique"):
        ray.get(epp.datastore.set_pods.remote([extra, extra]))


def test_a_restarted_metrics_actor_asks_the_datastore_for_its_pods(epp, sim):
    # a pod added after the metrics actor was created: a restart re-runs the constructor with the
    # old list, so the actor must ask the datastore for today's
    late = PodSpec(name="late-add", address=sim.pods[0].address, port=sim.pods[0].port)
    ray.get(epp.datastore.add_pod.remote(late))
    actor = ray.get(epp.datastore.metrics_actors.remote())["late-add"]
    pid = ray.get(actor.stats.remote())["pid"]
    try:
        ray.kill(actor, no_restart=False)
        wait_for(
            lambda: (st := _or_none(actor.stats)) and st["pid"] != pid and "late-add" in st["pods"],
            timeout=30,
            what="the restarted metrics actor scraping late-add",
        )
        wait_for(lambda: snapshot_names(epp) == {*BLOCKS, "late-add"}, what="every pod routable after the restart")
    finally:
        ray.get(epp.datastore.remove_pod.remote("late-add"))
    assert sorted(ray.get(actor.stats.remote())["pods"]) == sorted(BLOCKS)


def test_pods_beyond_the_per_actor_limit_get_another_metrics_actor(ray_session, sim):
    epp3 = start_epp_actors(CONFIG, pod_specs(sim), options=fast_options("t-shard", max_pods_per_metrics_actor=2))
    try:
        groups = ray.get(epp3.datastore.metrics_actor_groups.remote())
        assert sorted(len(g["pods"]) for g in groups.values()) == [1, 2]
        [first] = [k for k in groups if "#" not in k]
        assert set(groups) == {first, f"{first}#2"}
        assert named_actors("t-shard:metrics:") == {metrics_actor_name("t-shard", g) for g in groups}
        wait_for(lambda: snapshot_names(epp3) == set(BLOCKS), what="every pod routable")
        # the second actor's only pod goes: so does that actor
        [lone] = groups[f"{first}#2"]["pods"]
        ray.get(epp3.datastore.remove_pod.remote(lone))
        wait_for(lambda: named_actors("t-shard:metrics:") == {metrics_actor_name("t-shard", first)}, what="#2 gone")
        # adding it back: the first actor is full, so #2 comes back
        ray.get(epp3.datastore.add_pod.remote(pod_specs(sim)[[p.name for p in sim.pods].index(lone)]))
        groups = ray.get(epp3.datastore.metrics_actor_groups.remote())
        assert groups[f"{first}#2"]["pods"] == [lone]
        wait_for(lambda: snapshot_names(epp3) == set(BLOCKS), what="every pod routable again")
    finally:
        stop_epp_actors(epp3)
    assert not named_actors("t-shard:")


def test_datastore_restart_rebuilds_from_metrics_actors(epp, sim):
    # change the pod set at run time first: the rebuilt datastore must reflect it, not its constructor args
    ray.get(epp.datastore.remove_pod.remote("sim-2"))
    moved = PodSpec(name="late", address=sim.pods[2].address, port=sim.pods[2].port)
    ray.get(epp.datastore.add_pod.remote(moved))
    wait_for(lambda: snapshot_names(epp) == {"sim-0", "sim-1", "late"}, what="run-time pod set")
    version_before = ray.get(epp.datastore.version.remote())

    ray.kill(epp.datastore, no_restart=False)
    # a new incarnation starts its versions at the clock, above every version of the old one
    wait_for(lambda: (_or_none(epp.datastore.version) or 0) > version_before + 10**5, timeout=30, what="restart")
    assert _or_none(epp.datastore.pods) is not None
    assert {p["name"] for p in _call_when_available(epp.datastore.pods.remote)} == {"sim-0", "sim-1", "late"}
    wait_for(lambda: snapshot_names(epp) == {"sim-0", "sim-1", "late"}, what="rebuilt snapshot")
    version_after = _call_when_available(epp.datastore.version.remote)
    # the profile actor re-attached to the restarted datastore and follows its versions
    assert ray.get(epp.profiles["default"].ready.remote(version_after), timeout=10) >= version_after

    _call_when_available(lambda: epp.datastore.set_pods.remote(pod_specs(sim)))  # back to the module's pod set
    wait_for(lambda: snapshot_names(epp) == set(BLOCKS), what="original pods")


def _or_none(method):
    try:
        return ray.get(method.remote(), timeout=5)
    except Exception:
        return None


def test_run_batch_matches_in_process_scheduler(epp):
    actor = epp.profiles["default"]
    version, endpoints = ray.get(epp.datastore.snapshot.remote())
    ray.get(actor.ready.remote(version))
    calls = [ProfileCall(request(i), CycleState(), want_trace=True) for i in range(5)]
    outcomes = ray.get(actor.run_batch.remote(calls))
    sched = Scheduler.from_config(load_config(CONFIG))
    for i, outcome in enumerate(outcomes):
        assert outcome.error is None and outcome.result is not None
        assert outcome.started <= outcome.finished
        if outcome.snapshot_version != version:
            continue  # metrics moved between the two reads: nothing to compare
        trace = SchedulingTrace()
        expected = sched.schedule(request(i), endpoints, trace=trace)
        ours = outcome.trace
        assert ours["totals"] == trace.profiles["default"]["totals"]
        best = max(ours["totals"].values())
        winner = outcome.result.target_endpoints[0].name
        assert ours["totals"][winner] == best
        assert expected.target.name in {n for n, s in ours["totals"].items() if s == best}


def test_starting_again_reuses_the_named_actors(epp, sim):
    again = start_epp_actors(CONFIG, pod_specs(sim), options=fast_options("t-main"))
    assert again.datastore._actor_id == epp.datastore._actor_id
    assert again.profiles["default"]._actor_id == epp.profiles["default"]._actor_id
    handle = ray.get_actor(profile_actor_name("t-main", "default"), namespace=epp.namespace)
    assert handle._actor_id == epp.profiles["default"]._actor_id


def test_profile_actor_survives_a_kill(epp):
    actor = epp.profiles["default"]
    for _ in range(3):
        ray.get(actor.run_batch.remote([ProfileCall(request(), CycleState())]))
    calls_before = ray.get(actor.info.remote())["calls"]
    assert calls_before >= 3
    ray.kill(actor, no_restart=False)
    # ray.kill returns before the process dies: wait for the new process (its call count restarts).
    assert wait_for(lambda: _calls_or_none(actor) in (0,), timeout=30, what="a restarted profile actor")
    version = ray.get(epp.datastore.version.remote())
    assert wait_for(lambda: _ready_or_none(actor, version), timeout=30, what="restarted profile actor")
    # Right after a restart Ray may still answer "temporarily unavailable": retry, as the gateway does.
    [outcome] = _call_when_available(lambda: actor.run_batch.remote([ProfileCall(request(), CycleState())]))
    assert outcome.result is not None and outcome.result.target_endpoints[0].name in BLOCKS
    # A fresh process: its count restarted (one call, or two if a retried call ran twice).
    assert ray.get(actor.info.remote())["calls"] in (1, 2)


def _call_when_available(make_ref, timeout: float = 30.0):
    from ray.exceptions import ActorUnavailableError

    deadline = time.monotonic() + timeout
    while True:
        try:
            return ray.get(make_ref(), timeout=10)
        except ActorUnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _calls_or_none(actor):
    try:
        return ray.get(actor.info.remote(), timeout=5)["calls"]
    except Exception:
        return None


def _ready_or_none(actor, version):
    try:
        return ray.get(actor.ready.remote(version), timeout=5)
    except Exception:
        return None


def test_two_profile_actors_run_at_the_same_time_and_report_errors(ray_session, sim):
    epp2 = start_epp_actors(TWO_PROFILES, [], options=fast_options("t-two"))
    try:
        a, b = epp2.profiles["a"], epp2.profiles["b"]
        # an empty pool: every call fails with ServiceUnavailable
        [empty] = ray.get(a.run_batch.remote([ProfileCall(request(), CycleState())]))
        assert empty.result is None and empty.error.code is ErrorCode.SERVICE_UNAVAILABLE

        ray.get(epp2.datastore.add_pod.remote(pod_specs(sim)[0]))
        for actor in (a, b):
            wait_for(lambda actor=actor: ray.get(actor.info.remote())["endpoints"] == ["sim-0"], what="one endpoint")
        calls = [ProfileCall(request(i), CycleState(), want_trace=True) for i in range(3)]  # 3 x 60 ms a batch
        for _ in range(2):  # the first round warms both processes up
            outs_a, outs_b = ray.get([a.run_batch.remote(calls), b.run_batch.remote(calls)])
        assert all(o.result.target_endpoints[0].name == "sim-0" for o in outs_a)
        # profile b filters everything out: result None, the error, and a trace that shows why
        assert all(o.result is None and o.error.code is ErrorCode.INTERNAL for o in outs_b)
        assert outs_b[0].trace["error"] and outs_b[0].trace["filters"][1]["kept"] == []

        (start_a, end_a), (start_b, end_b) = (
            ray.get(a.run_intervals.remote())[-1],
            ray.get(b.run_intervals.remote())[-1],
        )
        assert end_a - start_a >= 0.15 and end_b - start_b >= 0.15
        overlap = min(end_a, end_b) - max(start_a, start_b)
        assert overlap > 0.1, f"profile runs did not overlap: a={start_a:.3f}-{end_a:.3f} b={start_b:.3f}-{end_b:.3f}"

        # the learned scorer's state lives in actor a: pre_request teaches it, response_complete undoes it
        def learned(outcome):
            return next(s["scores"] for s in outcome.trace["scorers"] if s["type"] == "test-learned-scorer")

        assert learned(outs_a[0]) == {"sim-0": 0.0}
        decision = SchedulingResult({"a": outs_a[0].result, "b": None}, "a")
        taught_event = ProfileEvent(LifecycleEvent.PRE_REQUEST, request(), result=decision)
        [_, taught] = ray.get(a.run_batch.remote([taught_event, ProfileCall(request(), CycleState(), want_trace=True)]))
        assert learned(taught) == {"sim-0": 1.0}
        done = ProfileEvent(LifecycleEvent.RESPONSE_COMPLETE, request().without_body(), endpoint_name="sim-0")
        [_, forgot] = ray.get(a.run_batch.remote([done, ProfileCall(request(), CycleState(), want_trace=True)]))
        assert learned(forgot) == {"sim-0": 0.0}
        assert ray.get(a.info.remote())["hook_errors"] == 0
    finally:
        stop_epp_actors(epp2)
    assert not named_actors("t-two:")


# A plugin whose hooks all raise comes first; a scorer that has response_complete without declaring
# ResponseComplete comes last: the profile actor must dispatch as the in-process Scheduler does.
HOOKS = """
plugins:
- type: test-failing-hooks
- type: test-learned-scorer
- type: test-undeclared-hook-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: test-failing-hooks
  - pluginRef: test-learned-scorer
  - pluginRef: test-undeclared-hook-scorer
  - pluginRef: max-score-picker
"""


def test_profile_actor_dispatches_hooks_by_declared_role_and_survives_failing_ones(ray_session, sim):
    """One rule in both places (scheduler/lifecycle.py): only declared roles get hooks; a hook that
    raises is counted and the other plugins still learn the decision and its end."""
    epp5 = start_epp_actors(HOOKS, pod_specs(sim)[:1], options=fast_options("t-hooks"))
    try:
        actor = epp5.profiles["default"]
        wait_for(lambda: ray.get(actor.info.remote())["endpoints"] == ["sim-0"], what="one endpoint")
        endpoints = ray.get(epp5.datastore.snapshot.remote())[1]
        sched = Scheduler.from_config(HOOKS)

        def scores(outcome_trace):
            return {s["type"]: s["scores"]["sim-0"] for s in outcome_trace["scorers"]}

        def call():
            return ProfileCall(request(), CycleState(), want_trace=True)

        def in_process():
            trace = SchedulingTrace()
            sched.schedule(request(), endpoints, trace, run_pre_request=False)
            return scores(trace.profiles["default"])

        [first] = ray.get(actor.run_batch.remote([call()]))
        decision = SchedulingResult({"default": first.result}, "default")
        assert first.result.target_endpoints[0].name == "sim-0"

        taught_by = ProfileEvent(LifecycleEvent.PRE_REQUEST, request(), result=decision)
        [_, taught] = ray.get(actor.run_batch.remote([taught_by, call()]))
        sched.pre_request(request(), decision)
        want = {"test-learned-scorer": 1.0, "test-undeclared-hook-scorer": 1.0}
        assert scores(taught.trace) == want == in_process()

        ended = request().without_body()
        kinds = (LifecycleEvent.FIRST_TOKEN, LifecycleEvent.RESPONSE_COMPLETE)
        events = [ProfileEvent(kind, ended, endpoint_name="sim-0") for kind in kinds]
        [*_, done] = ray.get(actor.run_batch.remote([*events, call()]))
        sched.response_first_token(ended, "sim-0")
        sched.response_complete(ended, "sim-0")
        want = {"test-learned-scorer": 0.0, "test-undeclared-hook-scorer": 1.0}  # the undeclared hook never ran
        assert scores(done.trace) == want == in_process()

        assert ray.get(actor.info.remote())["hook_errors"] == 3 == sched.hooks.errors
    finally:
        stop_epp_actors(epp5)


def test_metrics_actors_exit_when_their_datastore_is_gone(ray_session, sim):
    epp4 = start_epp_actors(CONFIG, pod_specs(sim)[:1], options=fast_options("t-orphan"))
    assert len(named_actors("t-orphan:metrics:")) == 1
    for actor in epp4.profiles.values():
        ray.kill(actor, no_restart=True)
    ray.kill(epp4.datastore, no_restart=True)  # no shutdown(): the detached metrics actors are orphans
    wait_for(lambda: not named_actors("t-orphan:metrics:"), timeout=15, what="orphaned metrics actors to exit")


def test_placement_prefers_the_pods_ray_node(ray_session):
    nodes = RayNodes.of(ray.nodes())
    ip, node_id = next(iter(nodes.by_ip.items()))
    strategy = affinity(pod_node(PodSpec(name="p", address=ip, port=1), nodes, None))
    assert strategy is not None and strategy.hard == [] and len(strategy.soft) == 1
    assert (strategy.soft[0].key, strategy.soft[0].operator.values) == (NODE_ID_LABEL, [node_id])
    assert affinity(pod_node(PodSpec(name="p", address="10.255.255.1", port=1), nodes, None)) is None
    # a loopback pod is on the caller's machine
    local = ray.get_runtime_context().get_node_id()
    local_strategy = affinity(pod_node(PodSpec(name="p", address="127.0.0.1", port=1), RayNodes(), local))
    assert local_strategy.soft[0].operator.values == [local]
    assert affinity(pod_node(PodSpec(name="p", address="127.0.0.1", port=1), RayNodes(), None)) is None
