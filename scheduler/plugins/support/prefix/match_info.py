"""What the prefix-cache scorer tells other plugins about an endpoint: how much of the request's
prompt it probably has cached (GIE's PrefixCacheMatchInfo attribute).

A prefix producer writes them, one per endpoint, under its PREFIX_MATCH_INFO key for the plugins
of its profile, and attaches each to its endpoint (`PREFIX_MATCH_KEY`); the profile copies it onto its
chosen targets, so e.g. the P/D decider reads it from the decode profile's target endpoint:
`endpoint.attributes.get(PREFIX_MATCH_KEY)`."""

from __future__ import annotations

from typing import NamedTuple

from scheduler.data_keys import DataKey, consumed_key
from scheduler.interfaces import PluginHandle

PREFIX_MATCH_KEY = "PrefixCacheMatchInfoKey"  # GIE's attribute key


class PrefixCacheMatchInfo(NamedTuple):
    """Immutable and cheap to build (a tuple): the scorer makes one per matched endpoint per request."""

    match_blocks: int  # leading prompt blocks the endpoint probably holds
    total_blocks: int  # blocks in the prompt (as hashed: at most maxPrefixBlocksToMatch)
    block_size_tokens: int

    @property
    def match_ratio(self) -> float:
        return self.match_blocks / self.total_blocks if self.total_blocks else 0.0

    @property
    def match_tokens(self) -> int:
        """The cached prefix length in (estimated) tokens."""
        return self.match_blocks * self.block_size_tokens

    @property
    def total_tokens(self) -> int:
        return self.total_blocks * self.block_size_tokens


# What a prefix producer writes in the cycle state: a PrefixCacheMatchInfo per endpoint name, under
# its own name (`PREFIX_MATCH_INFO.of(producer name)`; llm-d's default producer is the approximate one).
PREFIX_MATCH_INFO: DataKey[dict[str, PrefixCacheMatchInfo]] = DataKey(
    "prefix-cache-match-info", "approx-prefix-cache-producer"
)
# Beside it, matched blocks per server that holds any of the prompt (the index's holders, maybe
# beyond this pool): what a plugin that bounds a large pool reads, at the cost of the holders alone.
PREFIX_HOLDERS: DataKey[dict[str, int]] = DataKey("prefix-cache-holders", "approx-prefix-cache-producer")


def prefix_match_key(
    handle: PluginHandle, producer_name: str, field: str = "prefixMatchInfoProducerName"
) -> DataKey[dict[str, PrefixCacheMatchInfo]]:
    """The match-info key a consumer reads: that of the producer `producer_name` names, else llm-d's
    default producer's. A ValueError (a config error) when the name is no prefix producer."""
    return consumed_key(handle, PREFIX_MATCH_INFO, producer_name, field, "prefix-cache match")
