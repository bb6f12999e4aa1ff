"""Two routers' local mirrors (serve_app/llm_router/mirror.py) sharing one real profile actor: each decides
in its own process state, and learns the other's decisions through the actor's event log."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from actors.launcher import start_router_profile_actors, stop_router_profile_actors
from scheduler import Endpoint, LLMRequest, Metrics, build_plugins, load_config, schedule_cycles
from serve_app.llm_router.mirror import RouterMirror
from tests.serve_app.test_llm_router import CONFIG

NAMESPACE = "ray-epp-mirror-test"


def endpoints() -> list[Endpoint]:
    return [
        Endpoint(f"replica-{i}", "127.0.0.1", 8000 + i, {}, Metrics(cache_block_size=16, cache_num_blocks=4096))
        for i in range(4)
    ]


def request(prompt: str) -> LLMRequest:
    return LLMRequest(uuid.uuid4().hex, "base", {"model": "base", "prompt": prompt})


async def route(mirror: RouterMirror, handler, prompt: str) -> str:
    req = request(prompt)
    result = await schedule_cycles(handler, {"default": "default"}, mirror, req, endpoints())
    mirror.pre_request(req, result)
    name = result.primary.target_endpoints[0].name
    mirror.response_complete(req, name)
    return name


@pytest.fixture()
def actors(ray_session):
    cfg = load_config(CONFIG)
    yield cfg, start_router_profile_actors(cfg, namespace=NAMESPACE, options={"profile_num_cpus": 0.0})
    stop_router_profile_actors(cfg, namespace=NAMESPACE)


def test_a_prefix_one_router_placed_is_followed_by_the_other_and_by_a_late_one(actors):
    cfg, handles = actors
    handler = build_plugins(cfg).handler
    shared = uuid.uuid4().hex * 120

    async def run() -> tuple[list[str], dict]:
        a, b = RouterMirror(cfg, "a"), RouterMirror(cfg, "b")
        await a.attach(handles, 30)
        await b.attach(handles, 30)
        placed = [await route(a, handler, shared + " first")]
        for _ in range(200):  # a few sync rounds: b learns a's decision
            await asyncio.sleep(0.01)
            if b.counters.followed >= 2:
                break
        placed.append(await route(b, handler, shared + " second"))
        late = RouterMirror(cfg, "late")
        await late.attach(handles, 30)  # replays the actor's log
        placed.append(await route(late, handler, shared + " third"))
        for m in (a, b, late):
            await m.close()
        return placed, {"b": b.counters.as_dict(), "late": late.counters.as_dict()}

    placed, counters = asyncio.run(run())
    assert len(set(placed)) == 1, (placed, counters)
    assert counters["late"]["resets"] == 1 and counters["late"]["followed"] >= 2, counters  # a's, from the log
