"""Block keys against vectors made by vLLM's own hashing functions (tests/fixtures/kvevents)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ray_epp.kvevents import BlockHasher, external_hash

FIXTURE = Path(__file__).parent.parent / "fixtures" / "kvevents" / "vllm_block_hashes.json"
CASES = json.loads(FIXTURE.read_text())["cases"]


def _id(c: dict) -> str:
    return f"{c['algo']}-seed{c['seed']!r}-bs{c['block_size']}-{c['prompt']}-{c['lora_name']}-{c['cache_salt']}"


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_hashes_match_vllm(case: dict) -> None:
    h = BlockHasher(case["block_size"], case["algo"], seed=case["seed"])
    assert h.none_hash.hex() == case["none_hash"]
    got = h.hashes(case["token_ids"], lora_name=case["lora_name"], cache_salt=case["cache_salt"])
    assert got == case["hashes"]
    digests = h.digests(case["token_ids"], case["lora_name"], cache_salt=case["cache_salt"])
    assert [d.hex() for d in digests] == case["digests"]


def test_vectors_cover_the_settings() -> None:
    assert {c["algo"] for c in CASES} == {"sha256_cbor", "sha256", "xxhash_cbor", "xxhash"}
    assert {c["seed"] for c in CASES} == {"0", "", "42"}
    assert any(c["hashes"] == [] for c in CASES)  # a prompt shorter than a block has no key
    # the seed changes every key, and so do LoRA and salt
    by = {(c["algo"], c["seed"], c["block_size"], c["prompt"], c["lora_name"], c["cache_salt"]): c["hashes"]
          for c in CASES}
    base = by[("sha256_cbor", "0", 16, "short", None, None)]
    assert base != by[("sha256_cbor", "42", 16, "short", None, None)]
    assert base != by[("sha256_cbor", "0", 16, "short", "sql-lora", None)]
    salted = by[("sha256_cbor", "0", 16, "short", None, "salt-1")]
    assert salted[0] != base[0] and len(salted) == len(base)


def test_continuing_a_chain_from_a_parent_equals_the_whole_prompt() -> None:
    case = next(c for c in CASES if c["algo"] == "sha256_cbor" and c["prompt"] == "exact" and c["block_size"] == 16
                and c["lora_name"] is None and c["cache_salt"] is None and c["seed"] == "0")
    h = BlockHasher(16, seed="0")
    toks = case["token_ids"]
    first = h.hashes(toks[:32])
    rest = h.hashes(toks[32:], parent=first[-1])
    assert first + rest == case["hashes"]
    with pytest.raises(KeyError, match="not made by this hasher"):
        BlockHasher(16, seed="0").hashes(toks[32:], parent=first[-1])


def test_external_hash_is_the_low_64_bits_big_endian() -> None:
    d = bytes(range(32))
    assert external_hash(d) == int.from_bytes(d[-8:], "big")


@pytest.mark.parametrize(("args", "match"), [((0,), "block_size"), ((16, "md5"), "unknown prefix-caching hash")])
def test_bad_settings_are_clear_errors(args: tuple, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        BlockHasher(*args)


def test_an_unset_seed_is_resolved_as_vllm_does():
    """vllm/v1/core/kv_cache_utils.py resolve_none_hash_seed: the fixed "vllm-none-hash" for the
    SHA-256 algorithms, fresh random bytes per process for xxhash, PYTHONHASHSEED when set."""
    import hashlib

    import cbor2

    assert BlockHasher(16, "sha256_cbor").none_hash == hashlib.sha256(
        cbor2.dumps("vllm-none-hash", canonical=True)
    ).digest()
    assert BlockHasher(16, "sha256").seed == "vllm-none-hash"
    assert BlockHasher(16, "xxhash_cbor").seed != BlockHasher(16, "xxhash_cbor").seed
    assert BlockHasher(16, "xxhash", seed="42").seed == "42"
    assert BlockHasher(16, "sha256_cbor", seed="").seed == ""
