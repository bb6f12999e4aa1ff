"""What the prefix-cache scorer tells other plugins about an endpoint: how much of the request's
prompt it probably has cached (GIE's PrefixCacheMatchInfo attribute).

The scorer attaches one to every endpoint it scores with
`cycle_state.set_endpoint_attribute(name, PREFIX_MATCH_KEY, info)`; the profile copies it onto its
chosen targets, so e.g. the P/D decider reads it from the decode profile's target endpoint:
`endpoint.attributes.get(PREFIX_MATCH_KEY)`."""

from __future__ import annotations

from typing import NamedTuple

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
