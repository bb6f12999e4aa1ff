"""`token-load-scorer` (llm-d's pkg/epp/framework/plugins/scheduling/scorer/tokenload/token_load.go):
prefer endpoints with fewer estimated tokens, 1 - min(1, tokens / queueThresholdTokens) (default
4Mi tokens, 128 requests of 32K), where an endpoint's tokens are those in flight on it plus what
this request would add there: its prompt less what the endpoint has cached (the prefix-cache match
a producer set this cycle; none: the whole prompt), so cache warmth and load are weighed in the
same unit. Tokens are counted by `inflight-load-producer` (scheduler/plugins/support/
inflight_load_count.py), which writes them under INFLIGHT_LOAD for this profile run; without that
data (the producer failed) every endpoint scores alike."""

from __future__ import annotations

from pydantic import Field

from scheduler.cycle_state import CycleState
from scheduler.interfaces import Parameters, Scorer, ScorerCategory
from scheduler.plugins.support.inflight_load_count import INFLIGHT_LOAD
from scheduler.plugins.support.prefix import PREFIX_MATCH_KEY
from scheduler.registry import register
from scheduler.types import Endpoint, LLMRequest


class TokenLoadScorerParameters(Parameters):
    queue_threshold_tokens: int = Field(default=4 * 1024 * 1024, alias="queueThresholdTokens", gt=0)


@register
class TokenLoadScorer(Scorer):
    type_name = "token-load-scorer"
    category = ScorerCategory.DISTRIBUTION
    Parameters = TokenLoadScorerParameters
    consumes = (INFLIGHT_LOAD,)

    def score(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> dict[Endpoint, float]:
        load = cycle_state.get(INFLIGHT_LOAD)
        if load is None:
            return {}
        tokens, limit = load.tokens, self.params.queue_threshold_tokens
        matches = cycle_state.attribute_by_endpoint(PREFIX_MATCH_KEY)
        own = load.request_tokens
        return {ep: 1.0 - min(1.0, (tokens.get(ep.name, 0) + own(matches.get(ep.name))) / limit) for ep in endpoints}
