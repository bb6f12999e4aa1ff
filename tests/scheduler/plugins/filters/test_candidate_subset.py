"""candidate-subset-filter: a large pool is cut to the prefix holders, the least loaded and a
random sample; a small pool passes whole; the cut does not change where a request goes when the
winner is a holder or among the least loaded."""

from __future__ import annotations

import pytest

from scheduler import Scheduler
from scheduler.config import load_config
from scheduler.errors import ConfigError
from tests.scheduler.helpers import as_in_profile, endpoint, fresh_state, request

SHARED = "You are a helpful assistant. " * 40


def scheduler(subset: dict | None = None, with_filter: bool = True) -> Scheduler:
    plugins = [
        {"type": "approx-prefix-cache-producer", "parameters": {"blockSizeTokens": 16}},
        {"type": "prefix-cache-scorer", "parameters": {"prefixMatchInfoProducerName": "approx-prefix-cache-producer"}},
        {"type": "queue-scorer"},
    ]
    refs = [{"pluginRef": "prefix-cache-scorer", "weight": 3}, {"pluginRef": "queue-scorer", "weight": 2}]
    if with_filter:
        plugins.insert(0, {"type": "candidate-subset-filter", "parameters": subset or {}})
        refs.insert(0, {"pluginRef": "candidate-subset-filter"})
    profiles = [{"name": "default", "plugins": refs}]
    return Scheduler.from_config(load_config({"plugins": plugins, "schedulingProfiles": profiles}))


def pool(n: int, busy: int = 5):
    """n endpoints, all with `busy` requests waiting but the last three (0, 1 and 2 waiting)."""
    eps = [endpoint(f"p{i:03d}", waiting_queue_size=busy) for i in range(n - 3)]
    return eps + [endpoint(f"idle{i}", waiting_queue_size=i) for i in range(3)]


def test_a_small_pool_passes_whole():
    sched = scheduler({"maxCandidates": 32})
    f = sched.plugins["candidate-subset-filter"]
    eps = pool(20)
    assert as_in_profile(sched, f, request(prompt=SHARED), eps) == eps


@pytest.mark.parametrize(("n", "holders"), [(100, 1), (500, 3), (1000, 12)])
def test_a_large_pool_keeps_holders_least_loaded_and_a_sample(n, holders):
    sched = scheduler({"maxCandidates": 32, "maxPrefixHolders": 8, "leastLoaded": 8})
    eps = pool(n)
    for i in range(holders):  # p000.. hold the prefix
        sched.schedule(request(prompt=SHARED + f"warm {i}", request_id=f"w{i}"), [eps[i]])
    kept = as_in_profile(sched, sched.plugins["candidate-subset-filter"], request(prompt=SHARED + "q"), eps)
    names = [ep.name for ep in kept]
    assert len(names) == len(set(names)) == 32
    assert {f"p{i:03d}" for i in range(min(holders, 8))} <= set(names)
    assert {"idle0", "idle1", "idle2"} <= set(names)


def test_the_decision_is_the_full_pools_when_the_winner_is_a_holder_or_least_loaded():
    eps = pool(400)
    full, cut = scheduler(with_filter=False), scheduler({"maxCandidates": 16})
    for sched in (full, cut):
        sched.schedule(request(prompt=SHARED + "warm", request_id="w"), [eps[7]])
    for sched in (full, cut):
        hit = sched.schedule(request(prompt=SHARED + "q1", request_id="a"), eps, run_pre_request=False)
        cold = sched.schedule(request(prompt="a fresh prompt " * 40, request_id="b"), eps, run_pre_request=False)
        assert hit.profile_results["default"].target_endpoints[0].name == "p007"
        assert cold.profile_results["default"].target_endpoints[0].name == "idle0"


def test_the_sample_is_the_cycles_draw():
    """The same cycle seed, the same subset (a reproducible simulation)."""
    from scheduler.loop import CYCLE_SEED_KEY

    f = scheduler({"maxCandidates": 16, "maxPrefixHolders": 0, "leastLoaded": 2}).plugins["candidate-subset-filter"]
    eps = pool(300)

    def draw(seed: int) -> list[str]:
        state = fresh_state()
        state.write(CYCLE_SEED_KEY, seed)
        return [ep.name for ep in f.filter(state, request(prompt="x"), eps)]

    assert draw(1) == draw(1) and draw(1) != draw(2)


def test_the_parts_must_fit():
    with pytest.raises(ConfigError, match="at most maxCandidates"):
        scheduler({"maxCandidates": 8, "maxPrefixHolders": 8, "leastLoaded": 8})
