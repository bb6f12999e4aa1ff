"""The precise prefix index: events applied in order, evictions and clears, bounded pods, lookups
that walk the longest cached prefix, keys recomputed from token ids."""

from __future__ import annotations

import re
import zlib

import pytest

from ray_epp.kvevents import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch
from scheduler.plugins.support.prefix.precise_index import GAPPED, LIVE, UNKNOWN, PreciseIndex

BS = 4
PROMPT = list(range(100, 116))  # 4 blocks of 4 tokens


def stored(hashes, parent, tokens, **kw):
    return BlockStored(list(hashes), parent, list(tokens), BS, **kw)


def test_stored_blocks_match_the_prompt_that_made_them():
    index = PreciseIndex(BS)
    index.apply("a", [stored([11, 12], None, PROMPT[:8]), stored([13], 12, PROMPT[8:12])])
    keys = index.keys(PROMPT)
    assert len(keys) == 4
    assert index.match(keys) == {"a": 3}
    assert index.counts.stored == 3


def test_a_different_first_block_matches_nothing():
    index = PreciseIndex(BS)
    index.apply("a", [stored([11, 12], None, PROMPT[:8])])
    other = [1, 2, 3, 4, *PROMPT[4:]]
    assert index.match(index.keys(other)) == {}


def test_partial_last_block_is_not_a_key_and_max_blocks_caps():
    index = PreciseIndex(BS)
    assert len(index.keys([*PROMPT, 1, 2])) == 4
    assert len(index.keys(PROMPT, max_blocks=2)) == 2
    assert index.keys(PROMPT[:3]) == []


def test_keys_agree_whatever_sequence_holds_the_tokens():
    """A list (converted with fromlist), a tuple, a trailing partial block, a max_blocks cut and
    an id past 32 bits (folded) give the keys the plain constructor's bytes would."""
    index = PreciseIndex(BS)
    whole = index.keys(PROMPT)
    assert index.keys(tuple(PROMPT)) == whole
    assert index.keys([*PROMPT, 7, 8, 9]) == whole
    assert index.keys([*PROMPT, 7, 8, 9, 10, 11], max_blocks=4) == whole
    assert index.keys(PROMPT, max_blocks=3) == whole[:3]
    big = [2**40 + 5, *PROMPT[1:]]
    assert index.keys(big) == index.keys(tuple(big)) != whole


@pytest.mark.parametrize(
    ("held", "prompt", "counts"),
    [
        ([], PROMPT, {}),  # nobody holds anything
        (PROMPT[:8], PROMPT, {"a": 2}),  # a held prefix
        (PROMPT[:8], [1, 2, 3, 4, *PROMPT[4:]], {}),  # its first block held by nobody: not hashed further
        (PROMPT, PROMPT[:3], {}),  # shorter than a block
    ],
)
def test_lookup_is_match_of_keys_with_the_block_count(held, prompt, counts):
    index = PreciseIndex(BS)
    if held:
        index.apply("a", [stored(range(1, len(held) // BS + 1), None, held)])
    assert index.lookup(prompt) == (counts, len(prompt) // BS)
    assert index.lookup(prompt) == (index.match(index.keys(prompt)), len(index.keys(prompt)))
    assert index.lookup(prompt, max_blocks=1) == ({"a": 1} if counts else {}, min(1, len(prompt) // BS))


def test_removed_block_cuts_the_prefix_and_cleared_empties_the_pod():
    index = PreciseIndex(BS)
    index.apply_batches("a", [KVEventBatch(1.0, [stored([11, 12, 13], None, PROMPT[:12])])])
    index.apply("b", [stored([21], None, PROMPT[:4])])
    keys = index.keys(PROMPT)
    index.apply("a", [BlockRemoved([12])])
    assert index.match(keys) == {"a": 1, "b": 1}
    index.apply("a", [AllBlocksCleared()])
    assert index.match(keys) == {"b": 1}
    assert index.pod_blocks("a") == 0
    assert index.counts.cleared == 1 and index.counts.removed == 1


def test_engine_hashes_are_opaque_names_per_pod():
    """Two pods name the same blocks differently (another seed or algorithm): both match."""
    index = PreciseIndex(BS)
    index.apply("a", [stored([1, 2], None, PROMPT[:8])])
    index.apply("b", [stored([b"x1", b"x2"], None, PROMPT[:8])])
    assert index.match(index.keys(PROMPT)) == {"a": 2, "b": 2}
    index.apply("b", [BlockRemoved([b"x1"])])
    assert index.match(index.keys(PROMPT)) == {"a": 2}


def test_what_can_not_be_indexed_is_counted_and_skipped():
    index = PreciseIndex(BS)
    index.apply(
        "a",
        [
            BlockStored([1], None, PROMPT[:8], 8),  # another block size
            stored([2], None, [], medium="CPU"),  # another tier's store of names never stored here
            stored([3], 999, PROMPT[:4]),  # a parent never seen
            stored([4, 5], None, PROMPT[:4]),  # too few tokens
            BlockStored(None, None, PROMPT[:4], BS),  # malformed
            "garbage",
        ],
    )
    index.apply("a", [BlockRemoved([77])])
    assert index.counts.skipped == 6 and index.counts.unknown_removed == 1
    assert index.pod_blocks("a") == 0


def test_a_pod_is_bounded_by_its_capacity_oldest_first():
    index = PreciseIndex(BS, default_capacity=3)
    tokens = list(range(40))
    index.apply("a", [stored(range(10), None, tokens)])
    assert index.pod_blocks("a") == 3
    index.set_capacity("b", 5)
    index.apply("b", [stored(range(10), None, tokens)])
    assert index.pod_blocks("b") == 5
    # The first blocks were evicted first, so the prompt's prefix is gone, as on an engine.
    assert index.match(index.keys(tokens)) == {}


def test_status_and_removal():
    index = PreciseIndex(BS)
    assert index.status("a") == UNKNOWN
    index.set_status("a", LIVE)
    index.apply("a", [stored([1], None, PROMPT[:4])])
    index.set_status("a", GAPPED)
    assert index.statuses() == {"a": GAPPED}
    index.remove_pod("a")
    assert index.status("a") == UNKNOWN and index.match(index.keys(PROMPT)) == {}


def test_block_size_must_be_positive():
    with pytest.raises(ValueError, match="block size"):
        PreciseIndex(0)


def test_keys_kept_on_token_runs_equal_keys_from_the_tokens():
    """A run's keys (and its head's, which a prefix hit reuses) are the keys of its tokens, at
    every block size and cap; the head's are computed once and kept."""
    from scheduler.plugins.support.token_cache import PrefixTokenCache

    words = [f"w{i}" for i in range(400)]
    text = " ".join(words)

    def encode(t: str, special: bool) -> list[int]:  # a word-level tokenizer: one id per word
        return ([1] if special else []) + [zlib.crc32(m.group().encode()) % 50_000 for m in re.finditer(r"\S+", t)]

    def offsets(t: str) -> tuple[list[int], list[int]]:
        return encode(t, True), [0] + [m.end() for m in re.finditer(r"\S+", t)]

    for off in (None, offsets):
        cache = PrefixTokenCache(chunk_chars=200)
        first = cache.run(text + " end", encode, off)
        if off is None:
            cache.run(text + " again", encode, off)  # no offsets: the second one keeps the head
        hot = cache.run(text + " rest", encode, off)
        assert hot.head is not None and hot.ids[: len(hot.head.ids)] == hot.head.ids
        for bs in (4, 7, 16):
            index = PreciseIndex(bs)
            for run in (first, hot):
                for cap in (0, 5):
                    assert index.keys(run.ids, cap, run) == index.keys(list(run.ids), cap)
            kept = hot.head.derived[("precise-block-keys", bs)]
            assert index.keys(hot.ids, 0, hot)[: len(kept)] == kept
    other = PreciseIndex(4)
    assert other.keys([5, 6, 7, 8, 9], 0, first) == other.keys([5, 6, 7, 8, 9])  # not its run: ignored
