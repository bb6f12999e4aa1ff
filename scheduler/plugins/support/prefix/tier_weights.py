"""How much a cached block is worth by the memory it sits in (llm-d's device tiers): a prefix in GPU
memory is used as it is, one offloaded to CPU memory must be loaded back first, which is cheaper
than recomputing it but not free.

The rule is llm-d's (llm-d-kv-cache `kvcache.LongestPrefixScorer`, llm-d-router
`pkg/kvcache/kvblock_scorer.go`, configured by the precise producer's
`indexerConfig.kvCacheBackendConfigs` and `indexerConfig.kvCacheDefaultBackendWeight`):

* a pod's run is the prompt's leading blocks it holds in any tier, up to the first it holds in none;
* each block of the run adds the weight of the best tier the pod holds it in (a block on the GPU
  and on the CPU counts as on the GPU);
* a tier is named by the event's `medium` in lower case, no medium being the GPU (llm-d's
  `normalizeEventDeviceTier`); a tier no backend config names weighs the default weight (1.0
  unless configured, so an unknown medium counts as fully as the GPU);
* the pod's figure is the weighted sum truncated to whole blocks (llm-d's `int(score)`), the
  `match_blocks` a `PrefixCacheMatchInfo` carries (`whole_blocks`). One difference: the sum is
  truncated after a nudge of 1e-9, so floating-point error does not cost a block (llm-d's Go sums
  ten CPU blocks at 0.8 to 7.999999999999999 and scores 7; here 8).

With llm-d's defaults (gpu 1.0, cpu 0.8, any other tier 1.0) a pod holding a 10-block prefix on the
GPU scores 10 and one holding it on the CPU 8. (The defaults are llm-d-router's and
llm-d-kv-cache's `DefaultKVCacheBackendConfig`; some llm-d-router versions add lmcache-l1 0.8 or
storage tiers at 0.2-0.4, which here weigh the default unless configured.)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

GPU_TIER = "gpu"
DEFAULT_BACKEND_WEIGHT = 1.0  # llm-d's DefaultBackendWeight: a tier no config names
DEFAULT_TIER_WEIGHTS: Mapping[str, float] = {"gpu": 1.0, "cpu": 0.8}  # llm-d's defaults


def tier_of(medium: object) -> str:
    """The tier an event's `medium` names: its lower-case name, the GPU when it names none."""
    return medium.lower() if isinstance(medium, str) and medium else GPU_TIER


class Holders(Protocol):
    def get(self, key: int, /) -> set[str]: ...


class TierWeights:
    """Weights by tier name; `of(tier)`; `plain` when every block would weigh 1 (the GPU's weight
    and the default are 1), so a GPU-only index may count blocks instead of weighing them."""

    __slots__ = ("default", "plain", "weights")

    def __init__(self, weights: Mapping[str, float] | None = None, default: float = DEFAULT_BACKEND_WEIGHT) -> None:
        source = DEFAULT_TIER_WEIGHTS if weights is None else weights
        self.weights = {tier_of(name): float(w) for name, w in source.items()}
        self.default = float(default)
        self.plain = self.of(GPU_TIER) == 1.0 and self.default == 1.0

    def of(self, tier: str) -> float:
        return self.weights.get(tier, self.default)


def whole_blocks(score: float) -> int:
    """A weighted score in whole blocks (see the module docstring); huge weights saturate."""
    return int(min(score + 1e-9, 2.0**62))


def weighted_longest_prefix(
    keys: Iterable[int], tiers: Sequence[tuple[Holders, float]]
) -> tuple[dict[str, float], dict[str, int]]:
    """Per pod, its run's weighted score and its length in blocks, over `tiers` (each an index of
    which pods hold a block, with its weight). Pods holding no first block are absent."""
    scores: dict[str, float] = {}
    counts: dict[str, int] = {}
    alive: set[str] | None = None
    for key in keys:
        here: dict[str, float] = {}
        for holders, weight in tiers:
            for pod in holders.get(key):
                if weight > here.get(pod, -1.0):
                    here[pod] = weight
        alive = set(here) if alive is None else alive.intersection(here)
        if not alive:
            break
        for pod in alive:
            scores[pod] = scores.get(pod, 0.0) + here[pod]
            counts[pod] = counts.get(pod, 0) + 1
    return scores, counts
