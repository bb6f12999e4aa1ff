"""`context-length-aware` (llm-d's pkg/epp/framework/plugins/scheduling/scorer/contextlengthaware/
context_length_aware.go): route by prompt length to pods labelled with the range they serve,
`llm-d.ai/context-length-range: "0-2048"` (the label name is the `label` parameter).

Score (always): a pod without the label 0.5; a label that does not parse 0; in range
0.3 + 0.7 * (0.7 * 1/(1 + width/10000) + 0.3 * headroom/width) (a tight range with room scores
near 1, a zero-width range exactly 1); out of range 0.3 / (1 + distance/1000), so a 9000-token
prompt prefers max=8192 over max=2048. Filter (only with `enableFiltering`): keeps pods in range and
pods without the label; drops out-of-range and unparsable ones.

Token count: llm-d reads the token-producer's tokens, or, with none configured, its tokenizer-free
estimate; Ray EPP has no tokenizer and uses its own estimate, prompt characters / 4 (the same
count the prefill ledger uses), so a range boundary is approximate."""

from __future__ import annotations

from functools import lru_cache

from pydantic import Field

from scheduler.body_fields import PROMPT_FIELDS
from scheduler.cycle_state import CycleState
from scheduler.interfaces import Filter, Parameters, Scorer, ScorerCategory
from scheduler.plugins.support.prefill_ledger import prompt_tokens
from scheduler.registry import register
from scheduler.types import Endpoint, LLMRequest

DEFAULT_LABEL = "llm-d.ai/context-length-range"
MAX_FALLBACK_SCORE = 0.3


class ContextLengthAwareParameters(Parameters):
    label: str = Field(default=DEFAULT_LABEL, min_length=1)
    enable_filtering: bool = Field(default=False, alias="enableFiltering")


@lru_cache(maxsize=1024)
def parse_range(text: str) -> tuple[int, int] | None:
    """ "min-max" as two ints with min <= max, else None."""
    parts = text.split("-")
    if len(parts) != 2:
        return None
    try:
        low, high = int(parts[0].strip()), int(parts[1].strip())
    except ValueError:
        return None
    return (low, high) if low <= high else None


def range_score(tokens: int, low: int, high: int) -> float:
    if low <= tokens <= high:
        width = high - low
        if width == 0:
            return 1.0
        raw = 0.7 * (1.0 / (1.0 + width / 10000.0)) + 0.3 * ((high - tokens) / width)
        return MAX_FALLBACK_SCORE + raw * (1.0 - MAX_FALLBACK_SCORE)
    distance = tokens - high if tokens > high else low - tokens
    return MAX_FALLBACK_SCORE / (1.0 + distance / 1000.0)


@register
class ContextLengthAware(Filter, Scorer):
    type_name = "context-length-aware"
    body_fields = PROMPT_FIELDS  # the prompt's length
    category = ScorerCategory.AFFINITY
    Parameters = ContextLengthAwareParameters

    def filter(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        if not self.params.enable_filtering:
            return endpoints
        tokens = prompt_tokens(request)
        return [ep for ep in endpoints if self._admits(ep.labels.get(self.params.label), tokens)]

    @staticmethod
    def _admits(label: str | None, tokens: int) -> bool:
        """No label passes; a range passes when it holds the prompt; an unparsable one never does."""
        if label is None:
            return True
        bounds = parse_range(label)
        return bounds is not None and bounds[0] <= tokens <= bounds[1]

    def score(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> dict[Endpoint, float]:
        tokens = prompt_tokens(request)
        scores = {}
        for ep in endpoints:
            text = ep.labels.get(self.params.label)
            if text is None:
                scores[ep] = 0.5
            elif (bounds := parse_range(text)) is None:
                scores[ep] = 0.0
            else:
                scores[ep] = range_score(tokens, *bounds)
        return scores
