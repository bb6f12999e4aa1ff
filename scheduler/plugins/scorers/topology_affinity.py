"""`topology-affinity-scorer` (llm-d's pkg/epp/framework/plugins/scheduling/scorer/topologyaffinity/
scorer.go): grade each prefill candidate by the tightest tier it shares with the decode pick, on
llm-d's fixed curve shaped by KV-transfer bandwidth: host 1.0, rack 0.2, zone 0.05, region 0.02,
none 0. Every candidate scores 0 without a peer topology (see topology-affinity-filter)."""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import Field

from scheduler.cycle_state import CycleState
from scheduler.interfaces import Parameters, PluginHandle, Scorer, ScorerCategory
from scheduler.plugins.producers.topology_extractor import topologies_key
from scheduler.plugins.support.topology import Level, peer_endpoint
from scheduler.registry import register
from scheduler.types import Endpoint, LLMRequest

LEVEL_SCORES = {Level.HOST: 1.0, Level.RACK: 0.2, Level.ZONE: 0.05, Level.REGION: 0.02, Level.NONE: 0.0}


class TopologyAffinityScorerParameters(Parameters):
    topology_producer_name: str = Field(default="", alias="topologyProducerName")


@register
class TopologyAffinityScorer(Scorer):
    type_name = "topology-affinity-scorer"
    category = ScorerCategory.AFFINITY
    Parameters = TopologyAffinityScorerParameters

    def setup(self, handle: PluginHandle) -> None:
        self.topologies = topologies_key(handle, self.params.topology_producer_name)
        self.consumes = (self.topologies,)

    def score(
        self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]
    ) -> Mapping[Endpoint, float]:
        peer = peer_endpoint(cycle_state)
        topologies = cycle_state.get(self.topologies, {})
        peer_topology = topologies.get(peer.name) if peer is not None else None
        if peer_topology is None:
            return {ep: 0.0 for ep in endpoints}
        scores = {}
        for ep in endpoints:
            topology = topologies.get(ep.name)
            scores[ep] = LEVEL_SCORES[topology.level_to(peer_topology)] if topology is not None else 0.0
        return scores
