"""SGLang's router `cache_aware` policy (also vllm-router's, which shares the design and defaults),
written from its documentation and `--help`, for the cluster simulation.

Per request:

1. Load is the router's own count of requests in flight per worker. The load is *imbalanced* when
   `max - min > balance_abs_threshold` and `max > min * balance_rel_threshold`; then the request
   goes to the least-loaded worker.
2. Otherwise the request text is matched against an approximate radix tree of the texts each
   worker was sent. If the longest match covers more than `cache_threshold` of the text, the
   request goes to a worker holding that match; if not, to the worker that owns the least text in
   the tree (the emptiest cache).
3. The text is inserted into the tree under the chosen worker, in both cases.

Defaults are sglang-router 0.3.2's and vllm-router's (`--cache-threshold 0.3
--balance-abs-threshold 64 --balance-rel-threshold 1.5`). Where the documentation leaves a choice
open, this version takes the kinder one: several workers holding the longest match -> the least
loaded of them; ties -> seeded random. The tree is keyed on the text only, so a LoRA adapter's
requests are not kept together unless their texts are (as in the real router, which keys its
trees by the worker's model, the base model here)."""

from __future__ import annotations

from bench.policies.common import InFlight, request_text, serving
from bench.policies.text_tree import TextPrefixTree
from ray_epp.simulator import PodView, SimRequest


class SGLangCacheAware(InFlight):
    def __init__(
        self,
        seed: int = 0,
        cache_threshold: float = 0.3,
        balance_abs_threshold: int = 64,
        balance_rel_threshold: float = 1.5,
    ) -> None:
        super().__init__(seed)
        self.cache_threshold = cache_threshold
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold
        self.tree = TextPrefixTree()

    def imbalanced(self, names: list[str]) -> bool:
        loads = [self.load(n) for n in names]
        hi, lo = max(loads), min(loads)
        return hi - lo > self.balance_abs_threshold and hi > lo * self.balance_rel_threshold

    def route(self, request: SimRequest, pods: list[PodView], now: float) -> str:
        names = [p.name for p in serving(pods)]
        for n in names:
            self.tree.add_tenant(n)
        text = request_text(request)
        if self.imbalanced(names):
            pick = self.least_loaded(names)
        else:
            matched, holders = self.tree.match(text, names)
            if holders and text and matched / len(text) > self.cache_threshold:
                pick = self.least_loaded(holders)
            else:
                pick = self.rng.choice(self.tree.smallest(names))
        self.tree.insert(text, pick)
        self.sent(pick)
        return pick
