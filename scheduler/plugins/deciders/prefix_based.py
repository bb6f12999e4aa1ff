"""`prefix-based-pd-decider` (llm-d): disaggregate prefill when the part of the prompt the chosen
decode endpoint does not already hold is long enough to be worth a remote prefill.

    input tokens      = UTF-8 bytes of the prompt / 4   (llm-d's estimate; chat: the messages as JSON)
    cached tokens     = matched blocks x block size     (the decode target's PrefixCacheMatchInfo)
    disaggregate when   input tokens - cached tokens >= nonCachedTokens

`nonCachedTokens: 0` (the default) disables it. Without match info on the decode endpoint (no
prefix-cache-scorer in the decode profile) it never disaggregates and says so in the log once."""

from __future__ import annotations

import logging

from pydantic import Field

from scheduler.body_fields import PROMPT_FIELDS
from scheduler.cycle_state import CycleState
from scheduler.data_keys import DataKey
from scheduler.interfaces import Parameters, PDDecider, PluginHandle
from scheduler.plugins.support.prefix import AVERAGE_CHARS_PER_TOKEN, PREFIX_MATCH_KEY, PrefixCacheMatchInfo
from scheduler.registry import register
from scheduler.types import Endpoint, LLMRequest

log = logging.getLogger(__name__)

INPUT_TOKENS: DataKey[int] = DataKey("pd-decider/input-tokens")


class PrefixBasedPDDeciderParameters(Parameters):
    # The minimum length, in tokens, of the prompt's uncached suffix that triggers P/D; 0 disables.
    non_cached_tokens: int = Field(default=0, alias="nonCachedTokens", ge=0)


def input_tokens(request: LLMRequest) -> int:
    """llm-d's estimate of the prompt's length in tokens: its bytes / 4 (once per request)."""
    tokens = request.derived.get(INPUT_TOKENS)
    if tokens is None:
        tokens = len(request.prompt_text().encode()) // AVERAGE_CHARS_PER_TOKEN
        request.derived.put(INPUT_TOKENS, tokens)
    return tokens


@register
class PrefixBasedPDDecider(PDDecider):
    type_name = "prefix-based-pd-decider"
    body_fields = PROMPT_FIELDS  # the prompt's length
    Parameters = PrefixBasedPDDeciderParameters

    def setup(self, handle: PluginHandle) -> None:
        self.non_cached_tokens = self.params.non_cached_tokens
        self._warned = False

    def might_disaggregate(self, cycle_state: CycleState, request: LLMRequest) -> bool:
        """A prompt shorter than nonCachedTokens never disaggregates, whatever decode holds."""
        return self.non_cached_tokens > 0 and input_tokens(request) >= self.non_cached_tokens

    def disaggregate(self, cycle_state: CycleState, request: LLMRequest, decode_endpoint: Endpoint) -> bool:
        threshold = self.non_cached_tokens
        if threshold == 0 or decode_endpoint is None:
            return False
        tokens = input_tokens(request)
        if tokens < threshold:  # even with nothing cached the prompt is too short
            return False
        info = decode_endpoint.attributes.get(PREFIX_MATCH_KEY)
        if not isinstance(info, PrefixCacheMatchInfo):
            if not self._warned:
                self._warned = True
                log.warning(
                    "%s: decode endpoint %s carries no prefix-cache match info (is a prefix-cache-scorer in the "
                    "decode profile?); not disaggregating",
                    self.name,
                    decode_endpoint.name,
                )
            return False
        return tokens - info.match_blocks * info.block_size_tokens >= threshold
