"""Ray Serve's request routers, written from their documentation and behaviour, for the cluster
simulation: the default power-of-two-choices router and ray.llm's PrefixCacheAffinityRouter.

Both balance on the router's count of requests in flight per replica (Ray Serve probes replicas
for their ongoing requests; ray.llm's deployments default max_ongoing_requests to 1e9, so no
replica ever refuses one and there is no back-off to model).

**Multiplexed models (LoRA).** Ray Serve LLM serves LoRA adapters as multiplexed models; a
request for an adapter first narrows the candidates to the replicas that have the adapter loaded,
else to the replicas with the fewest adapters loaded (Ray's multiplex routing). A replica's loaded
set is modelled as an LRU of the adapters routed to it, as many as the pod has LoRA slots
(`max_active_models`) — the router learns of loads at once, which is kinder than Ray's periodic
reports.

**PrefixCacheAffinityRouter** (defaults `imbalanced_threshold=inf`, `match_rate_threshold=0.1`,
eviction off): if the candidates' queue lengths differ by more than `imbalanced_threshold`,
power-of-two; otherwise match the request text against a prefix tree of what each replica was
sent: a match of at least `match_rate_threshold` of the text -> the replicas holding it, else the
replicas owning the least text; the shortest queue among them wins. The text is inserted under
the chosen replica."""

from __future__ import annotations

import math
from collections import OrderedDict

from bench.policies.common import InFlight, request_text, serving
from bench.policies.text_tree import TextPrefixTree
from ray_epp.simulator import DEFAULT_MODEL, PodView, SimRequest

DEFAULT_SLOTS = 4


class RayPowerOfTwo(InFlight):
    """Ray Serve's default router: two random candidates, the shorter queue wins (ties random)."""

    def __init__(self, seed: int = 0, base_model: str = DEFAULT_MODEL) -> None:
        super().__init__(seed)
        self.base_model = base_model
        self.models: dict[str, OrderedDict[str, None]] = {}

    def candidates(self, request: SimRequest, pods: list[PodView]) -> list[PodView]:
        cands = serving(pods)
        if request.model == self.base_model:
            return cands
        holding = [p for p in cands if request.model in self.models.get(p.name, ())]
        if holding:
            return holding
        fewest = min(len(self.models.get(p.name, ())) for p in cands)
        return [p for p in cands if len(self.models.get(p.name, ())) == fewest]

    def power_of_two(self, names: list[str]) -> str:
        pair = self.rng.sample(names, 2) if len(names) >= 2 else names
        return self.least_loaded(pair)

    def route(self, request: SimRequest, pods: list[PodView], now: float) -> str:
        cands = self.candidates(request, pods)
        return self.routed(request, cands, self.power_of_two([p.name for p in cands]))

    def routed(self, request: SimRequest, cands: list[PodView], pick: str) -> str:
        self.sent(pick)
        if request.model != self.base_model:
            lru = self.models.setdefault(pick, OrderedDict())
            lru[request.model] = None
            lru.move_to_end(request.model)
            pod = next(p for p in cands if p.name == pick)
            slots = int(pod.metrics.get("max_active_models") or DEFAULT_SLOTS)
            while len(lru) > slots:
                lru.popitem(last=False)
        return pick


class RayPrefixCacheAffinity(RayPowerOfTwo):
    def __init__(
        self,
        seed: int = 0,
        base_model: str = DEFAULT_MODEL,
        imbalanced_threshold: float = math.inf,
        match_rate_threshold: float = 0.1,
    ) -> None:
        super().__init__(seed, base_model)
        self.imbalanced_threshold = imbalanced_threshold
        self.match_rate_threshold = match_rate_threshold
        self.tree = TextPrefixTree()

    def route(self, request: SimRequest, pods: list[PodView], now: float) -> str:
        for p in serving(pods):
            self.tree.add_tenant(p.name)
        cands = self.candidates(request, pods)
        names = [p.name for p in cands]
        text = request_text(request)
        queues = [self.load(n) for n in names]
        chosen: list[str] = []
        if max(queues) - min(queues) <= self.imbalanced_threshold:
            matched, holders = self.tree.match(text, names)
            if text and matched / len(text) >= self.match_rate_threshold and holders:
                chosen = holders
            else:
                chosen = self.tree.smallest(names)
        pick = self.least_loaded(chosen) if chosen else self.power_of_two(names)
        self.tree.insert(text, pick)
        return self.routed(request, cands, pick)
