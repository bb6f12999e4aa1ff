"""A profile actor with a standby (serve_app/gateway/failover_link.py), on the session's one Ray node: the
standby follows the events, takes the calls when the primary is gone and keeps them after the
restarted primary (empty) is back, which follows the events until the standby is gone in turn.
(Placement on another node, and a node's loss: tests/multinode.)"""

from __future__ import annotations

import asyncio
import contextlib
import os

import pytest

from tests.serve_app.deployments import pod_specs, sim_pods

pytestmark = pytest.mark.ray

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.fixture(scope="module")
def sim():
    yield from sim_pods(2, seed=5)


@pytest.fixture(scope="module")
def actors(ray_session, sim):
    from actors.launcher import start_epp_actors, stop_epp_actors
    from scheduler import load_config_file

    config = load_config_file("default")
    actors = start_epp_actors(config, pod_specs(sim), options={"datastore_name": "standby-test"})
    yield actors
    stop_epp_actors(actors)


def test_one_node_gets_no_standby(actors):
    assert actors.standbys == {} and actors.gateway_shards() == actors.shards


def test_a_gone_primary_fails_over_to_its_warm_standby_which_stays_the_decider(actors):
    import ray

    from actors.profile_actor import ProfileActor
    from actors.protocol import StandbyPair
    from scheduler import CycleState, LLMRequest, SchedulingResult, build_plugins, dump_config
    from serve_app.gateway.ray_runner import RayProfileRunner

    primary = actors.profiles["default"]
    standby = ProfileActor.options(name="standby-test:profile:default:standby", max_restarts=-1).remote(
        dump_config(actors.config), "default", actors.datastore_name, actors.namespace, actors.options.model_dump()
    )
    try:
        ray.get(standby.ready.remote(1), timeout=60)
        runner = RayProfileRunner(
            {"default": [StandbyPair(primary, standby)]}, build_plugins(actors.config).body_fields, failover_after_s=2.0
        )
        (link,) = runner.links["default"]

        async def decide(i: int) -> str:
            request = LLMRequest(f"r{i}", MODEL, {"model": MODEL, "prompt": f"a long shared prefix {i % 3} " * 30})
            result = (await runner(["default"], request, CycleState(), None, None))["default"]
            assert result is not None, f"request {i} got no decision"
            runner.pre_request(request, SchedulingResult({"default": result}, "default"))
            runner.response_complete(request, result.target_endpoints[0].name)
            return result.target_endpoints[0].name

        async def gone(actor) -> None:
            while ray._private.state.actors(actor._actor_id.hex())["State"] == "ALIVE":
                await asyncio.sleep(0.05)  # the kill is asynchronous: until then the old process answers

        async def scenario() -> dict:
            for i in range(6):
                await decide(i)
            # the standby learned every decision and completion, in order, without deciding any
            for _ in range(50):
                infos = await asyncio.gather(primary.info.remote(), standby.info.remote())
                if infos[1]["events"] == infos[0]["events"]:
                    break
                await asyncio.sleep(0.05)
            warm = {"primary": infos[0], "standby": infos[1]}
            pid = infos[0]["pid"]
            ray.kill(primary, no_restart=False)  # Ray restarts it, empty
            await gone(primary)
            loop = asyncio.get_running_loop()
            started = loop.time()
            await decide(6)
            failover_s = loop.time() - started
            failovers = link.failovers
            served = await standby.info.remote()
            while not link.up[0]:  # the probe sees the restarted primary
                await asyncio.sleep(0.05)
            await decide(7)  # the survivor decides: the restarted primary only follows
            back = await primary.info.remote()
            for _ in range(50):  # the mirror leaves within 20 ms
                if (back := await primary.info.remote())["events"].get("pre_request", 0) >= 1:
                    break
                await asyncio.sleep(0.05)
            ray.kill(standby, no_restart=True)  # now the survivor goes: the primary decides again
            await gone(standby)
            while os.path.exists(f"/proc/{served['pid']}"):  # dead to Ray before its process exits,
                await asyncio.sleep(0.05)  # which answers on the same-node channel until then
            await decide(8)
            again = await primary.info.remote()
            return {
                "warm": warm,
                "failover_s": failover_s,
                "failovers": failovers,
                "standby": served,
                "back": back,
                "again": again,
                "old_pid": pid,
            }

        out = asyncio.run(scenario())
    finally:
        with contextlib.suppress(Exception):
            ray.kill(standby, no_restart=True)
    warm = out["warm"]
    assert warm["standby"]["calls"] == 0 and warm["primary"]["calls"] == 6
    assert warm["standby"]["events"] == warm["primary"]["events"], warm
    assert warm["standby"]["events"]["pre_request"] == 6 and warm["standby"]["events"]["response_complete"] == 6
    assert warm["standby"]["state_sizes"] == warm["primary"]["state_sizes"], warm  # the same prefix index
    assert out["failovers"] == 1 and out["standby"]["calls"] == 1  # request 6: decided by the standby
    assert out["failover_s"] < 5.0, out["failover_s"]  # within the request's budget (10 s)
    assert out["back"]["pid"] != out["old_pid"] and out["back"]["calls"] == 0  # request 7: the standby's
    # ... which the restarted primary learned; request 6's too when it was back (a quiet machine
    # restarts it in milliseconds) before the standby's events for request 6 were sent on
    assert out["back"]["events"]["pre_request"] in (1, 2), out["back"]["events"]
    assert link.failovers == 2 and out["again"]["calls"] == 1  # request 8: the primary, once the standby went
