"""Our Scheduler as a cluster-simulation router: endpoints, admission, prefix learning, P/D."""

from __future__ import annotations

from bench.drivers import ClusterSimDriver
from bench.policies import SchedulerRouter, config_path, make_policy
from bench.policies.epp import VIRTUAL_EPOCH
from ray_epp.simulator import PodView, make_pod_configs
from scheduler import load_config

from . import helpers
from .helpers import SYSTEM, pods, req


def default_router() -> SchedulerRouter:
    return make_policy("epp-default")


def test_pod_views_become_endpoints_with_scrape_times():
    r = default_router()
    view = pods("a", waiting_queue_size=3, kv_cache_usage_percent=0.5, active_models=["lora-x"])[0]
    view.scraped_at = 12.5
    ep = r.endpoint(view)
    assert ep.name == "a" and ep.labels == {"llm-d.ai/role": "both"}
    assert ep.metrics.waiting_queue_size == 3 and ep.metrics.kv_cache_usage_percent == 0.5
    assert set(ep.metrics.active_models) == {"lora-x"} and ep.metrics.cache_num_blocks == 27000
    assert ep.metrics.update_time == VIRTUAL_EPOCH + 12.5
    assert r.endpoint(view) is ep  # reused until the next scrape
    view.metrics = dict(view.metrics, waiting_queue_size=7)
    assert r.endpoint(view).metrics.waiting_queue_size == 7


def test_sheddable_requests_are_shed_when_the_pool_is_saturated():
    r = default_router()
    busy = pods("a", "b", waiting_queue_size=6)  # queue / 5 >= 1 on every pod: saturated
    assert r.route(req("s", "x", priority=-1), busy, 0.0) is None
    assert r.shed == {"s"}
    assert r.route(req("c", "x", priority=1), busy, 0.0) in {"a", "b"}  # critical still scheduled
    assert r.route(req("n", "x", priority=0), busy, 0.0) in {"a", "b"}
    assert r.shed == {"s"} and not r.errors


def test_sheddable_requests_run_when_the_pool_has_room():
    r = default_router()
    assert r.route(req("s", "x", priority=-1), pods("a", "b", waiting_queue_size=2), 0.0) in {"a", "b"}
    assert not r.shed


def test_stale_metrics_count_as_saturated():
    r = default_router()
    view = pods("a", "b")  # idle, but last scraped at t=0
    assert r.route(req("s1", "x", priority=-1), view, 0.1) is not None  # 100 ms old: fresh
    assert r.route(req("s2", "x", priority=-1), view, 5.0) is None  # 5 s old: stale, so saturated
    assert r.shed == {"s2"}


def test_admission_can_be_turned_off():
    r = SchedulerRouter(config_path("epp-default"), admission=False)
    assert r.route(req("s", "x", priority=-1), pods("a", waiting_queue_size=50), 0.0) == "a"


def test_the_legacy_tree_drops_sheddable_requests_as_sheds():
    r = SchedulerRouter(config_path("epp-legacy-filter-tree"), admission=False)
    full = pods("a", "b", waiting_queue_size=200, kv_cache_usage_percent=0.95)
    assert r.route(req("s", "x", priority=-1), full, 0.0) is None
    assert r.shed == {"s"} and not r.errors


def test_the_prefix_index_learns_each_decision():
    r = make_policy("epp-gie-default")
    four = pods("a", "b", "c", "d")
    first = r.route(req("r0", SYSTEM + "q0"), four, 0.0)
    assert all(r.route(req(f"r{i}", SYSTEM + f"q{i}"), four, 0.0) == first for i in range(1, 6))


def test_first_tokens_reach_the_prefill_ledger():
    """With the default config, a follow-up returns to the prefix's pod once the earlier requests'
    first tokens have arrived (their prompt work there is done)."""
    r = default_router()
    four = pods("a", "b", "c", "d")
    for i in range(6):
        request = req(f"r{i}", SYSTEM + f"q{i}")
        pod = r.route(request, four, float(i))
        if i == 0:
            home = pod
        assert pod == home
        r.on_first_token(request, pod, i + 0.5)
    assert r.scheduler.plugins["prefill-eta-scorer"].backlog() == {}


def test_pd_config_answers_prefill_and_decode_pods():
    r = make_policy("epp-pd")
    pd_pods = pods("p0", role="prefill") + pods("d0", role="decode")
    decision = r.route(req("r0", "long prompt " * 200), pd_pods, 0.0)
    assert decision == ("p0", "d0")


def test_response_complete_reaches_plugins_that_count_in_flight():
    yaml = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: active-request-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: active-request-scorer
"""
    r = SchedulerRouter(load_config(yaml))
    two = pods("a", "b")
    first = r.route(req("r0", "x"), two, 0.0)
    second = r.route(req("r1", "y"), two, 0.0)
    assert {first, second} == {"a", "b"}  # the first one's pod was busier
    r.on_complete(helpers.req("r0", "x"), first, None)
    assert r.route(req("r2", "z"), two, 0.0) == first  # released: now the idle one


def test_overload_in_the_cluster_sim_sheds_only_sheddable_requests():
    from bench.workloads import mixed_priority_spec, random_prompt_workload

    work = random_prompt_workload(mixed_priority_spec(600), 400, seed=1)  # far more than 2 pods take
    result = ClusterSimDriver().run("epp-default", make_pod_configs(2), work, seed=0)
    by = {o.request_id: o for o in result.outcomes}
    shed = [by[r.request_id] for r in work if by[r.request_id].status == "shed"]
    assert shed and all(o.priority < 0 for o in shed)
    assert result.metrics["shed"] == len(shed)
    assert result.metrics["by_priority"]["1"]["completed"] == sum(1 for r in work if r.priority > 0)


def test_a_seed_makes_tie_breaks_and_whole_runs_repeatable():
    from bench.workloads import random_prompt_workload, uniform_spec

    four = pods("a", "b", "c", "d")  # equal metrics: every pick is a random tie-break

    def picks(seed: int) -> list[str]:
        r = make_policy("epp-gie-default", seed)
        return [r.route(req(f"r{i}", f"unique prompt {i}"), four, 0.0) for i in range(40)]

    assert picks(0) == picks(0)
    assert picks(0) != picks(1)
    work = random_prompt_workload(uniform_spec(300), 100, seed=2)
    runs = [ClusterSimDriver().run("epp-default", make_pod_configs(4), work, seed=0) for _ in range(2)]
    assert runs[0].outcomes == runs[1].outcomes


def test_unknown_policies_and_configs_are_errors():
    import pytest

    with pytest.raises(ValueError, match="known"):
        make_policy("no-such-policy")
    with pytest.raises(ValueError, match="no config file"):
        make_policy("epp-no-such-config")
    assert isinstance(make_policy("epp:" + str(config_path("epp-lora"))), SchedulerRouter)
    assert PodView  # imported for the type


def test_the_timed_router_passes_kv_events_through_only_to_a_listener():
    """The simulation turns its pods' events on only for a router with `on_kv_events`: the
    driver's timing wrapper must show the hook exactly when the policy has it."""
    from bench.drivers import TimedRouter

    precise = make_policy("epp-precise")
    assert TimedRouter(precise).on_kv_events == precise.on_kv_events
    assert not hasattr(TimedRouter(default_router()), "on_kv_events")
