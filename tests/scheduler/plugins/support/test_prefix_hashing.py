"""Prompt block hashing (scheduler.plugins.support.prefix.hashing): GIE's approximate-prefix hashPrompt cases
(block counts from approximateprefix/plugin_test.go) and the chain checked against an independent
streaming xxh64 computation."""

import struct

import pytest
import xxhash

from scheduler import LLMRequest
from scheduler.plugins.support.prefix import (
    hash_prompt,
    prefix_block_hashes,
    prefix_hashes_key,
    set_prefix_block_hashes,
)
from tests.scheduler.helpers import request


def reference_hashes(data: bytes, model: str, salt: str, block_chars: int, max_blocks: int) -> list[int]:
    """GIE's algorithm written independently: xxh64 streams, explicit full blocks then one partial."""
    if block_chars <= 0 or len(data) < block_chars:
        return []
    data = data[: block_chars * max_blocks]
    seed = xxhash.xxh64()
    seed.update(model.encode())
    seed.update(salt.encode())
    prev = seed.intdigest()
    out = []
    full, rest = divmod(len(data), block_chars)
    chunks = [data[i * block_chars : (i + 1) * block_chars] for i in range(full)]
    if rest:
        chunks.append(data[full * block_chars :])
    for chunk in chunks:
        h = xxhash.xxh64()
        h.update(chunk)
        h.update(struct.pack("<Q", prev))
        prev = h.intdigest()
        out.append(prev)
    return out


@pytest.mark.parametrize(
    ("prompt", "block_size_tokens", "max_blocks", "expected_blocks"),
    [
        pytest.param("aaaabbbb", 1, 256, 2, id="two full blocks"),
        pytest.param("aaaaaa", 1, 256, 2, id="trailing partial block is hashed"),
        pytest.param("aaa", 1, 256, 0, id="shorter than one block: no hashes"),
        pytest.param("", 1, 256, 0, id="empty prompt"),
        pytest.param("a" * 128, 16, 256, 2, id="16 tokens = 64 chars per block"),
        pytest.param("a" * 128, 8, 256, 4, id="8 tokens = 32 chars per block"),
        pytest.param("a" * 128, 32, 256, 1, id="one block exactly"),
        pytest.param("aaaabbbbccccdddd", 1, 2, 2, id="capped at max blocks"),
        pytest.param("aaaabbbbccccdddd", 1, 3, 3, id="capped at 3 blocks"),
        pytest.param("aaaabbbbcc", 1, 2, 2, id="cap drops the partial block"),
        pytest.param("aaaabbbbcc", 1, 0, 0, id="zero max blocks: no hashes"),
        pytest.param("aaaabbbb", 0, 256, 0, id="zero block size: no hashes"),
        pytest.param("é" * 4, 1, 256, 2, id="blocks are UTF-8 bytes, not characters"),
    ],
)
def test_block_counts_and_chain(prompt, block_size_tokens, max_blocks, expected_blocks):
    got = hash_prompt(prompt, "test-model1", block_size_tokens, max_blocks)
    assert len(got) == expected_blocks
    assert got == reference_hashes(prompt.encode(), "test-model1", "", block_size_tokens * 4, max_blocks)


def test_chain_names_the_whole_prefix():
    short = hash_prompt("aaaabbbb", "m", 1, 256)
    longer = hash_prompt("aaaabbbbcccc", "m", 1, 256)
    assert longer[:2] == short
    # the same block after a different prefix hashes differently
    assert hash_prompt("xxxxbbbb", "m", 1, 256)[1] != short[1]
    # a partial block differs from the full block it starts
    assert hash_prompt("aaaabb", "m", 1, 256)[1] != short[1]


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        pytest.param(("test-model1", ""), ("test-model2", ""), False, id="model separates"),
        pytest.param(("m", "salt-1"), ("m", "salt-2"), False, id="cache salt separates"),
        pytest.param(("m", ""), ("m", "salt"), False, id="salt vs none"),
        pytest.param(("m", "s"), ("m", "s"), True, id="same model and salt"),
    ],
)
def test_seed_is_model_and_salt(a, b, same):
    ha = hash_prompt("aaaabbbbcccc", a[0], 1, 256, cache_salt=a[1])
    hb = hash_prompt("aaaabbbbcccc", b[0], 1, 256, cache_salt=b[1])
    assert (ha == hb) is same
    if not same:
        assert not set(ha) & set(hb)


def test_request_uses_model_salt_and_prompt_text():
    req = LLMRequest("r1", "m", body={"prompt": "aaaabbbbcc", "cache_salt": "s"})
    assert prefix_block_hashes(req, 1, 256) == hash_prompt("aaaabbbbcc", "m", 1, 256, cache_salt="s")
    assert prefix_block_hashes(req, 1, 256) == reference_hashes(b"aaaabbbbcc", "m", "s", 4, 256)


def test_chat_messages_are_hashed_as_json():
    messages = [{"role": "user", "content": "hello world"}, {"role": "assistant", "content": "hi there"}]
    req = LLMRequest("r1", "m", body={"messages": messages})
    hashes = prefix_block_hashes(req, 1, 256)
    assert len(hashes) > 1
    assert hashes == hash_prompt(req.prompt_text(), "m", 1, 256)


def test_memoised_per_block_size_and_max_blocks():
    req = request(model="m", prompt="a" * 300)
    first = prefix_block_hashes(req, 16, 256)
    assert prefix_block_hashes(req, 16, 256) is first
    assert req.derived.get(prefix_hashes_key(16, 256)) is first
    other = prefix_block_hashes(req, 8, 256)
    assert len(other) == 10 and len(first) == 5
    assert len(prefix_block_hashes(req, 16, 2)) == 2


def test_precomputed_hashes_stand_in_for_the_prompt():
    """The Ray layer ships hashes to profile actors instead of the prompt."""
    hashes = hash_prompt("a" * 300, "m", 16, 256)
    bare = LLMRequest("r1", "m", body={})
    set_prefix_block_hashes(bare, 16, 256, hashes)
    assert prefix_block_hashes(bare, 16, 256) == hashes
    assert prefix_block_hashes(bare, 8, 256) == []  # other geometry: computed from the (empty) prompt
