"""`prefix-cache-scorer`: endpoints that probably hold more of the prompt's prefix in their KV cache
score higher.

It reads the PrefixCacheMatchInfo a prefix producer wrote for this cycle (a consumer of the key
`PREFIX_MATCH_INFO.of(producer)`): the producer `prefixMatchInfoProducerName` names, else the plugin
named `approx-prefix-cache-producer` (llm-d's default). The producer, which the profile runs before
its filters, does the matching and learns each decision; this scorer only turns the match into a
score. GIE's older combined form (the scorer given the producer's parameters, no producer named)
is expanded by the config loader into a `gie-prefix-cache-producer` beside the scorer
(scheduler/config/combined_prefix.py).

Score = matched blocks / prompt blocks; with matchLengthWeight w, blended as llm-d does with
min(1, matched tokens / matchLengthScaleTokens)^2."""

from __future__ import annotations

from pydantic import Field

from scheduler.body_fields import CACHE_SALT_FIELDS, PROMPT_FIELDS
from scheduler.cycle_state import CycleState
from scheduler.interfaces import Parameters, PluginHandle, Scorer, ScorerCategory
from scheduler.plugins.support.prefix.match_info import prefix_match_key
from scheduler.registry import register
from scheduler.types import Endpoint, LLMRequest


class PrefixCacheParameters(Parameters):
    """llm-d's scorer parameters: the producer's name, the match-length blend."""

    prefix_match_info_producer_name: str = Field(default="", alias="prefixMatchInfoProducerName")
    match_length_weight: float = Field(default=0.0, alias="matchLengthWeight", ge=0.0, le=1.0)
    match_length_scale_tokens: int = Field(default=8192, alias="matchLengthScaleTokens")


@register
class PrefixCacheScorer(Scorer):
    type_name = "prefix-cache-scorer"
    body_fields = PROMPT_FIELDS | CACHE_SALT_FIELDS  # its own producer's, in GIE's combined form
    category = ScorerCategory.AFFINITY
    Parameters = PrefixCacheParameters

    def setup(self, handle: PluginHandle) -> None:
        p: PrefixCacheParameters = self.params
        if p.match_length_weight > 0 and p.match_length_scale_tokens <= 0:
            raise ValueError("matchLengthScaleTokens must be > 0 when matchLengthWeight is > 0")
        self.match_length_weight = p.match_length_weight
        self.match_length_scale_tokens = p.match_length_scale_tokens
        self.match_key = prefix_match_key(handle, p.prefix_match_info_producer_name)
        self.consumes = (self.match_key,)

    def score(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> dict[Endpoint, float]:
        infos = cycle_state.get(self.match_key, {})
        scores = dict.fromkeys(endpoints, 0.0)
        w = self.match_length_weight
        for ep in endpoints:
            info = infos.get(ep.name)
            if info is None or not info.match_blocks or not info.total_blocks:
                continue
            ratio = info.match_blocks / info.total_blocks
            if w > 0.0:
                length = min(1.0, info.match_tokens / self.match_length_scale_tokens)
                ratio = w * length * length + (1.0 - w) * ratio
            scores[ep] = ratio
        return scores
