"""Approximate prefix-cache awareness: prompt block hashing, the per-server block index, and the
match information the prefix-cache scorer attaches to endpoints. Helpers of the prefix-cache
scorer and the P/D deciders, not plugins."""

from scheduler.plugins.support.prefix.hashing import (
    AVERAGE_CHARS_PER_TOKEN,
    DEFAULT_BLOCK_SIZE_TOKENS,
    DEFAULT_MAX_PREFIX_BLOCKS,
    hash_blocks,
    hash_prompt,
    prefix_block_hashes,
    prefix_hashes_key,
    set_prefix_block_hashes,
)
from scheduler.plugins.support.prefix.index import (
    DEFAULT_LRU_CAPACITY_PER_SERVER,
    PREFIX_INDEX_HOLDINGS,
    IndexHoldings,
    PrefixIndex,
)
from scheduler.plugins.support.prefix.match_info import (
    PREFIX_HOLDERS,
    PREFIX_MATCH_INFO,
    PREFIX_MATCH_KEY,
    PrefixCacheMatchInfo,
)

__all__ = [
    "AVERAGE_CHARS_PER_TOKEN",
    "DEFAULT_BLOCK_SIZE_TOKENS",
    "DEFAULT_LRU_CAPACITY_PER_SERVER",
    "DEFAULT_MAX_PREFIX_BLOCKS",
    "PREFIX_HOLDERS",
    "PREFIX_INDEX_HOLDINGS",
    "PREFIX_MATCH_INFO",
    "PREFIX_MATCH_KEY",
    "IndexHoldings",
    "PrefixCacheMatchInfo",
    "PrefixIndex",
    "hash_blocks",
    "hash_prompt",
    "prefix_block_hashes",
    "prefix_hashes_key",
    "set_prefix_block_hashes",
]
