"""`topology-affinity-filter` (llm-d's pkg/epp/framework/plugins/scheduling/filter/topologyaffinity/
filter.go): in the prefill profile of a P/D request, keep the candidates at least as close to the
decode pick as `minAffinity` (host < rack < zone < region), so the KV-cache transfer stays on NVLink
or one switch.

Fails open as llm-d does: with no peer (not a P/D request, or prefill ran beside decode under
parallelStages) or a peer without topology, every candidate is kept; if no candidate is close enough,
every candidate is kept. A candidate without topology never passes."""

from __future__ import annotations

from pydantic import Field, field_validator

from scheduler.cycle_state import CycleState
from scheduler.interfaces import Filter, Parameters, PluginHandle
from scheduler.plugins.producers.topology_extractor import topologies_key
from scheduler.plugins.support.topology import Level, peer_endpoint
from scheduler.registry import register
from scheduler.types import Endpoint, LLMRequest


class TopologyAffinityFilterParameters(Parameters):
    min_affinity: str = Field(default="host", alias="minAffinity")
    topology_producer_name: str = Field(default="", alias="topologyProducerName")

    @field_validator("min_affinity")
    @classmethod
    def _level(cls, v: str) -> str:
        Level.parse(v or "host")
        return v or "host"


@register
class TopologyAffinityFilter(Filter):
    type_name = "topology-affinity-filter"
    Parameters = TopologyAffinityFilterParameters

    def setup(self, handle: PluginHandle) -> None:
        self.min_affinity = Level.parse(self.params.min_affinity)
        self.topologies = topologies_key(handle, self.params.topology_producer_name)
        self.consumes = (self.topologies,)

    def filter(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> list[Endpoint]:
        peer = peer_endpoint(cycle_state)
        topologies = cycle_state.get(self.topologies, {})
        peer_topology = topologies.get(peer.name) if peer is not None else None
        if peer_topology is None:
            return endpoints
        close = []
        for ep in endpoints:
            topology = topologies.get(ep.name)
            if topology is not None and topology.level_to(peer_topology) <= self.min_affinity:
                close.append(ep)
        return close or endpoints
