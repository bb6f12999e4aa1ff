"""The peer policies' routing logic on small hand-made cases."""

from __future__ import annotations

import math

from bench.policies import RayPowerOfTwo, RayPrefixCacheAffinity, SGLangCacheAware, TextPrefixTree
from bench.policies.text_tree import common_prefix_len

from .helpers import SYSTEM, pods, req

PODS = pods("a", "b", "c", "d")


def test_common_prefix_len():
    assert common_prefix_len("abcdef", "xxabcdzz", 2) == 4
    assert common_prefix_len("abc", "abc", 0) == 3
    assert common_prefix_len("abc", "ab", 0) == 2
    assert common_prefix_len("abc", "zzz", 0) == 0


def test_text_tree_matches_splits_and_counts_characters():
    t = TextPrefixTree()
    t.insert("hello world", "a")
    t.insert("hello there", "b")
    assert t.match("hello world!") == (11, ["a"])
    assert t.match("hello t") == (7, ["b"])
    assert t.match("hello x") == (6, ["a", "b"])
    assert t.match("nothing") == (0, [])
    assert t.match("hello world", ["b"]) == (6, ["b"])  # only b's part counts for b
    assert t.sizes == {"a": 11, "b": 11}
    t.insert("hello world", "b")
    assert t.sizes["b"] == 16  # "world" is new to b, "hello " was not
    assert t.smallest(["a", "b", "c"]) == ["c"]


def route_all(policy, requests, pod_list=PODS):
    return [policy.route(r, pod_list, 0.0) for r in requests]


def test_sglang_sends_a_repeated_prefix_back_to_the_same_worker_when_balanced():
    p = SGLangCacheAware(seed=1)
    first = p.route(req("r0", SYSTEM + "question one"), PODS, 0.0)
    again = route_all(p, [req(f"r{i}", SYSTEM + f"question {i}") for i in range(1, 6)])
    assert set(again) == {first}


def test_sglang_sends_new_text_to_the_emptiest_worker():
    p = SGLangCacheAware(seed=1)
    picks = route_all(p, [req(f"r{i}", f"{i}" * 500) for i in range(4)])
    assert sorted(picks) == ["a", "b", "c", "d"]  # each went to a worker with an empty tree


def test_sglang_goes_to_the_least_loaded_worker_when_imbalanced():
    p = SGLangCacheAware(seed=1)
    home = p.route(req("r0", SYSTEM + "q"), PODS, 0.0)
    for _ in range(70):  # 71 in flight on `home`, 0 elsewhere: 71 - 0 > 64 and 71 > 0 * 1.5
        p.sent(home)
    pick = p.route(req("r1", SYSTEM + "q again"), PODS, 0.0)
    assert pick != home and p.load(pick) == 1
    # below the absolute threshold the cache wins again
    p2 = SGLangCacheAware(seed=1)
    home2 = p2.route(req("r0", SYSTEM + "q"), PODS, 0.0)
    for _ in range(50):
        p2.sent(home2)
    assert p2.route(req("r1", SYSTEM + "q again"), PODS, 0.0) == home2


def test_sglang_below_the_cache_threshold_goes_to_the_smallest_tree():
    p = SGLangCacheAware(seed=1)
    home = p.route(req("r0", "x" * 100), PODS, 0.0)
    # shares 100 of 1,000 characters (10% < 30%): not routed for the cache
    pick = p.route(req("r1", "x" * 100 + "y" * 900), PODS, 0.0)
    assert pick != home


def test_sglang_releases_load_on_completion():
    p = SGLangCacheAware(seed=1)
    r = req("r0", "text")
    pod = p.route(r, PODS, 0.0)
    assert p.load(pod) == 1
    p.on_complete(r, pod, None)
    assert p.load(pod) == 0


def test_ray_prefix_affinity_follows_the_prefix_and_balances_new_text():
    p = RayPrefixCacheAffinity(seed=2)
    assert p.imbalanced_threshold == math.inf and p.match_rate_threshold == 0.1
    first = p.route(req("r0", SYSTEM + "one"), PODS, 0.0)
    assert set(route_all(p, [req(f"r{i}", SYSTEM + str(i)) for i in range(1, 5)])) == {first}
    # unmatched text: the replicas owning the least text (not `first`), shortest queue among them
    others = route_all(p, [req(f"n{i}", f"{i}" * 300) for i in range(3)])
    assert sorted(others) == sorted({"a", "b", "c", "d"} - {first})


def test_ray_prefix_affinity_uses_power_of_two_when_imbalanced():
    p = RayPrefixCacheAffinity(seed=2, imbalanced_threshold=3)
    home = p.route(req("r0", SYSTEM + "q"), PODS, 0.0)
    for _ in range(10):
        p.sent(home)
    picks = route_all(p, [req(f"r{i}", SYSTEM + f"q{i}") for i in range(1, 8)])
    assert home not in picks  # power of two never prefers the long queue


def test_ray_power_of_two_prefers_replicas_holding_the_adapter():
    p = RayPowerOfTwo(seed=3)
    first = p.route(req("r0", "x", model="lora-a"), PODS, 0.0)
    for i in range(5):
        assert p.route(req(f"r{i}", "y", model="lora-a"), PODS, 0.0) == first
    # a new adapter goes to the replicas with the fewest adapters: not `first`
    assert p.route(req("n", "z", model="lora-b"), PODS, 0.0) != first


def test_ray_power_of_two_forgets_adapters_beyond_the_pods_slots():
    p = RayPowerOfTwo(seed=3)
    two = pods("a", "b", max_active_models=2)
    for i, m in enumerate(["m1", "m2", "m3", "m4"]):
        p.route(req(f"r{i}", "x", model=m), two, 0.0)
    assert all(len(lru) <= 2 for lru in p.models.values())


def test_ray_power_of_two_base_model_requests_pick_the_shorter_of_two_queues():
    p = RayPowerOfTwo(seed=4)
    two = pods("a", "b")
    for _ in range(5):
        p.sent("a")
    assert route_all(p, [req(f"r{i}", "x") for i in range(3)], two) == ["b", "b", "b"]
