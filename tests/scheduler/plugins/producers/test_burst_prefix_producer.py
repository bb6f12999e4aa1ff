"""`burst-prefix-cache-producer`: llm-d's sample config loads as written and, driven by concurrent
requests, steers a burst of one prompt's samples to one replica while other traffic is balanced;
its parameters are checked as llm-d checks them."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from scheduler import Scheduler
from scheduler.config import load_config, load_config_file
from scheduler.errors import ConfigError
from scheduler.plugins.producers.burst_prefix import BurstPrefixCacheProducer
from scheduler.plugins.scorers.prefix_cache import PrefixCacheScorer
from scheduler.plugins.support.prefix import PREFIX_MATCH_KEY
from tests.scheduler.helpers import endpoint, request

FIXTURE = Path(__file__).parents[3] / "fixtures" / "llm-d" / "epp-burst-prefix-cache-config.yaml"
PROMPT = "an RL rollout prompt that all samples of one group share, long enough for many blocks. " * 20


def pool() -> list:
    return [endpoint(f"decode-{c}", {"llm-d.ai/role": "decode"}) for c in "abcd"] + [
        endpoint("prefill-a", {"llm-d.ai/role": "prefill"})
    ]


def target(result) -> str:
    return result.profile_results[result.primary_profile_name].target_endpoints[0].name


async def burst(sched: Scheduler, prompts: list[str], eps: list) -> list[str]:
    results = await asyncio.gather(
        *(sched.aschedule(request(prompt=p, request_id=f"r{i}"), eps) for i, p in enumerate(prompts))
    )
    return [target(r) for r in results]


def test_llmd_sample_loads_and_co_locates_a_burst():
    sched = Scheduler.from_config(load_config_file(FIXTURE))
    producer = sched.plugins["burst-prefix-cache-producer"]
    assert isinstance(producer, BurstPrefixCacheProducer) and producer.window_s == 0.1
    assert next(p for p in sched.plugins.values() if isinstance(p, PrefixCacheScorer)).match_key == producer.produces[0]
    eps = pool()
    # Two groups of 4 samples and 4 unrelated prompts, all in one window. The sample's tokenizer
    # server (<vllm-service>) does not resolve: the prompts are hashed from their text.
    prompts = [PROMPT + "A"] * 4 + [PROMPT + "B"] * 4 + [f"unrelated prompt {i} " * 30 for i in range(4)]
    started = time.monotonic()
    picked = asyncio.run(burst(sched, prompts, eps))
    assert time.monotonic() - started >= 0.1  # everyone waited for the window
    assert producer.sealed_windows == 1
    assert all(p.startswith("decode-") for p in picked)  # decode-filter still applies
    assert len(set(picked[:4])) == 1 and len(set(picked[4:8])) == 1 and picked[0] != picked[4]
    # Nothing is learnt across windows: a later lone sample of group A has no affinity.
    again = asyncio.run(burst(sched, [PROMPT + "A"], eps))
    assert producer.sealed_windows == 2 and again[0].startswith("decode-")


def test_a_lone_request_is_left_to_the_other_scorers():
    sched = Scheduler.from_config(load_config_file(FIXTURE))
    eps = pool()
    eps[0] = endpoint("decode-a", {"llm-d.ai/role": "decode"}, waiting_queue_size=40)
    eps[1] = endpoint("decode-b", {"llm-d.ai/role": "decode"}, waiting_queue_size=40)
    eps[2] = endpoint("decode-c", {"llm-d.ai/role": "decode"}, waiting_queue_size=40)
    # Alone in its window: zero everywhere, the load-aware scorer sends it to the idle decode-d.
    assert asyncio.run(burst(sched, [PROMPT], eps)) == ["decode-d"]
    # A group of 2 on the same pool: its replica is the least loaded *in the window* (then fewer
    # running requests, then the name; llm-d deliberately ignores queue depth there), and the
    # burst affinity (weight 2) outweighs the load scorer (weight 1).
    assert asyncio.run(burst(sched, [PROMPT, PROMPT], eps)) == ["decode-a", "decode-a"]


def test_the_match_info_is_a_full_match_on_the_assigned_replica():
    sched = Scheduler.from_config(load_config_file(FIXTURE))
    eps = pool()
    producer = sched.plugins["burst-prefix-cache-producer"]
    seen = []
    produce = producer.produce

    def spy(cycle_state, req, endpoints):
        produce(cycle_state, req, endpoints)
        infos = cycle_state.get(producer.produces[0])
        seen.append((dict(infos), dict(cycle_state.attribute_by_endpoint(PREFIX_MATCH_KEY))))

    producer.produce = spy
    picked = asyncio.run(burst(sched, [PROMPT] * 3, eps))
    for (infos, attrs), name in zip(seen, picked, strict=True):
        assert infos == attrs
        full = [n for n, i in infos.items() if i.match_blocks]
        assert full == [name] and infos[name].match_blocks == infos[name].total_blocks > 0


def test_the_sync_path_refuses_rather_than_schedule_without_the_window():
    sched = Scheduler.from_config(load_config_file(FIXTURE))
    with pytest.raises(RuntimeError, match="burst-prefix-cache-producer waits"):
        sched.schedule(request(prompt=PROMPT), pool())


def test_a_full_window_schedules_the_rest_without_affinity():
    sched = Scheduler.from_config(load_config(_config({"maxBatchSize": 2})))
    producer = sched.plugins["burst-prefix-cache-producer"]
    picked = asyncio.run(burst(sched, [PROMPT] * 3, pool()))
    assert producer.full_rejections == 1 and len(picked) == 3


def test_max_per_replica_caps_a_group():
    sched = Scheduler.from_config(load_config(_config({"maxPerReplica": 2, "windowDurationMs": 50})))
    picked = asyncio.run(burst(sched, [PROMPT] * 8, pool()))
    assert sorted(picked) == sorted(["decode-a", "decode-b", "decode-c", "decode-d"] * 2)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"windowDurationMs": 0}, "windowDurationMs"),
        ({"windowDurationMs": 10001}, "windowDurationMs"),
        ({"maxPerReplica": 0}, "maxPerReplica"),
        ({"maxBatchSize": -2}, "maxBatchSize"),
        ({"blockSizeTokens": 0}, "blockSizeTokens"),
        ({"maxPrefixTokensToMatch": 10}, "must be 0 or >= blockSizeTokens"),
        ({"minColocateBlocks": -1}, "minColocateBlocks"),
        ({"balanceBy": "bytes"}, "balanceBy"),
    ],
)
def test_parameters_are_checked_as_llmd_checks_them(params, message):
    with pytest.raises(ConfigError, match=message):
        Scheduler.from_config(load_config(_config(params)))


def _config(params: dict) -> dict:
    return {
        "apiVersion": "llm-d.ai/v1alpha1",
        "kind": "EndpointPickerConfig",
        "plugins": [
            {"type": "decode-filter"},
            {"type": "burst-prefix-cache-producer", "parameters": params},
            {"type": "prefix-cache-scorer",
             "parameters": {"prefixMatchInfoProducerName": "burst-prefix-cache-producer"}},
            {"type": "load-aware-scorer"},
            {"type": "max-score-picker"},
        ],
        "schedulingProfiles": [
            {"name": "default", "plugins": [
                {"pluginRef": "decode-filter"},
                {"pluginRef": "prefix-cache-scorer", "weight": 2.0},
                {"pluginRef": "load-aware-scorer", "weight": 1.0},
                {"pluginRef": "max-score-picker"},
            ]},
        ],
    }  # fmt: skip
