"""Device tiers in the precise index (llm-d's rule): each (block, pod) keeps the tier it is in, a
match weighs a pod's run by the best tier of each block and truncates to whole blocks, a removal
drops one tier, a GPU-only index matches exactly as before."""

from __future__ import annotations

import random

import pytest

from ray_epp.kvevents import AllBlocksCleared, BlockRemoved, BlockStored
from scheduler.plugins.support.prefix.index import PrefixIndex
from scheduler.plugins.support.prefix.precise_index import PreciseIndex
from scheduler.plugins.support.prefix.speculative_entries import SpeculativeEntries
from scheduler.plugins.support.prefix.tier_weights import (
    TierWeights,
    tier_of,
    weighted_longest_prefix,
    whole_blocks,
)

BS = 4
PROMPT = list(range(200, 240))  # 10 blocks


def gpu(pod: str, blocks: int, start: int = 0) -> list[BlockStored]:
    """`pod` stores the prompt's blocks [start, blocks) on the GPU, named pod-<i>."""
    parent = f"{pod}-{start - 1}" if start else None
    names = [f"{pod}-{i}" for i in range(start, blocks)]
    return [BlockStored(names, parent, PROMPT[start * BS : blocks * BS], BS)]


def moved(pod: str, blocks: range, medium: str = "CPU") -> list[object]:
    """The blocks go from the GPU to `medium`, named only (vLLM's offloading events)."""
    names = [f"{pod}-{i}" for i in blocks]
    return [BlockStored(names, None, [], BS, medium=medium), BlockRemoved(names)]


def index_with(*events_by_pod: tuple[str, list[object]], weights: TierWeights | None = None) -> PreciseIndex:
    index = PreciseIndex(BS, weights=weights)
    for pod, events in events_by_pod:
        index.apply(pod, events)
    return index


@pytest.mark.parametrize(
    ("events", "expect"),
    [
        ([("a", gpu("a", 10))], {"a": 10}),  # all on the GPU: the block count
        ([("a", gpu("a", 10) + moved("a", range(10)))], {"a": 8}),  # all on the CPU: 10 * 0.8 (float: 7.99...)
        ([("a", gpu("a", 10) + moved("a", range(5, 10)))], {"a": 9}),  # 5 + 5 * 0.8
        ([("a", gpu("a", 3) + moved("a", range(3)))], {"a": 2}),  # 2.4 truncated, as llm-d's int()
        ([("a", gpu("a", 4) + moved("a", range(1, 2)))], {"a": 3}),  # 3.8: a CPU block inside a GPU run
        ([("a", gpu("a", 10) + moved("a", range(10), "DISK"))], {"a": 10}),  # an unknown tier: the default 1.0
        ([("a", gpu("a", 10) + moved("a", range(10))), ("b", gpu("b", 6))], {"a": 8, "b": 6}),
        ([("a", gpu("a", 10) + moved("a", range(10))), ("b", gpu("b", 9))], {"a": 8, "b": 9}),  # GPU 9 > CPU 10
    ],
    ids=["gpu", "cpu", "gpu-then-cpu", "truncated", "cpu-inside", "unknown-tier", "two-pods", "gpu-beats-cpu"],
)
def test_a_match_is_the_weighted_longest_prefix(events, expect):
    index = index_with(*events)
    keys = index.keys(PROMPT)
    assert index.match(keys) == expect
    assert index.lookup(PROMPT) == (expect, 10)


def test_a_block_in_two_tiers_counts_at_the_better_and_a_removal_drops_one_tier():
    index = index_with(("a", gpu("a", 4)))
    names = [f"a-{i}" for i in range(4)]
    index.apply("a", [BlockStored(names, None, [], BS, medium="CPU")])  # a copy on the CPU too
    keys = index.keys(PROMPT)
    assert index.match(keys) == {"a": 4} and index.offloaded_blocks("a") == {"cpu": 4}
    index.apply("a", [BlockRemoved(names[2:])])  # off the GPU: blocks 2, 3 now on the CPU only
    assert index.match(keys) == {"a": 3}  # 2 + 2 * 0.8 = 3.6
    index.apply("a", [BlockRemoved(names[3:], medium="CPU")])  # block 3 held nowhere: the run ends
    assert index.match(keys) == {"a": 2}  # 2 + 0.8
    index.apply("a", [BlockRemoved(names[3:], medium="CPU")])  # its name went with its last tier
    assert index.counts.unknown_removed == 1


def test_a_named_store_keeps_the_keys_its_gpu_store_gave_and_cleared_empties_every_tier():
    index = index_with(("a", gpu("a", 6) + moved("a", range(6))), ("b", gpu("b", 2)))
    keys = index.keys(PROMPT)
    assert index.pod_blocks("a") == 0 and index.offloaded_blocks("a") == {"cpu": 6}
    index.apply("a", gpu("a", 2))  # loaded back: on the GPU again (and on the CPU until it says not)
    index.apply("a", [BlockRemoved(["a-0", "a-1"], medium="CPU")])
    assert index.match(keys) == {"a": 5, "b": 2}  # 2 + 4 * 0.8 = 5.2
    index.apply("a", [AllBlocksCleared()])
    assert index.match(keys) == {"b": 2} and index.offloaded_blocks("a") == {}
    index.apply("b", moved("b", range(2)))
    index.remove_pod("b")
    assert index.match(keys) == {} and index.offloaded_blocks("b") == {}


def test_weights_are_configured_by_tier_name_in_lower_case():
    weights = TierWeights({"GPU": 1.0, "cpu": 0.5}, default=0.25)
    assert (weights.of("gpu"), weights.of("cpu"), weights.of("disk")) == (1.0, 0.5, 0.25)
    assert not weights.plain and TierWeights().plain and not TierWeights({"gpu": 0.9}).plain
    assert [tier_of(m) for m in (None, "", "GPU", "CPU", "LMCache-L1")] == ["gpu", "gpu", "gpu", "cpu", "lmcache-l1"]
    index = index_with(("a", gpu("a", 10) + moved("a", range(4), "disk")), weights=weights)
    assert index.match(index.keys(PROMPT)) == {"a": 7}  # 4 * 0.25 + 6


def test_whole_blocks_absorbs_float_error_and_saturates():
    assert [whole_blocks(x) for x in (0.0, 0.999, 7.999999999999999, 2.4, 1e300 * 10)] == [0, 0, 8, 2, 2**62]


def test_speculative_entries_weigh_the_default_weight_over_the_union_of_runs():
    index = index_with(("a", gpu("a", 10) + moved("a", range(10))))
    index.speculative = SpeculativeEntries(2.0)
    keys = index.keys(PROMPT)
    index.speculative.add("a", keys[:5], now=0.0)  # predicted: the first 5 on the GPU-weight default
    index.speculative.add("b", keys, now=0.0)
    assert index.match(keys) == {"a": 9, "b": 10}  # a: 5 * 1.0 + 5 * 0.8


def test_a_gpu_only_index_matches_as_the_block_count_whatever_the_events():
    """Random GPU stores, removals and clears over three pods: the weighed walk (llm-d's rule) and
    the block count (the path a GPU-only index takes) agree on every prefix of every prompt."""
    rng = random.Random(7)
    prompts = [[rng.randrange(50) for _ in range(8 * BS)] for _ in range(6)]
    index = PreciseIndex(BS, default_capacity=40)
    named: dict[str, list[object]] = {"a": [], "b": [], "c": []}  # what each pod was told to store
    for step in range(300):
        pod = rng.choice("abc")
        tokens = rng.choice(prompts)
        n = rng.randrange(1, 9)
        roll = rng.random()
        if roll < 0.6:
            named[pod] += [(pod, step, i) for i in range(n)]
            index.apply(pod, [BlockStored(named[pod][-n:], None, tokens[: n * BS], BS)])
        elif roll < 0.95:
            index.apply(pod, [BlockRemoved(rng.sample(named[pod], min(len(named[pod]), n)))])
        else:
            index.apply(pod, [AllBlocksCleared()])
        for prompt in prompts:
            keys = index.keys(prompt)
            scores, counts = index.weighted(keys)
            assert index.match(keys) == counts == {p: whole_blocks(s) for p, s in scores.items()}
    assert index.offloaded == {}


def test_the_walk_stops_at_the_first_block_a_pod_holds_in_no_tier():
    gpu_index, cpu_index = PrefixIndex(), PrefixIndex()
    gpu_index.add([1, 2, 4], "a")
    cpu_index.add([3, 5], "a")
    cpu_index.add([1, 2, 3, 4, 5], "b")
    scores, counts = weighted_longest_prefix([1, 2, 3, 4, 5, 6], [(gpu_index, 1.0), (cpu_index, 0.5)])
    assert counts == {"a": 5, "b": 5} and scores == {"a": 4.0, "b": 2.5}  # a: 1 + 1 + 0.5 + 1 + 0.5
