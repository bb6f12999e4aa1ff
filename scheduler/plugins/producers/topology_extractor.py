"""`topology-extractor` (llm-d's pkg/epp/framework/plugins/datalayer/extractor/topology/extractor.go):
an endpoint's Topology from its pod labels. A Producer: before the profile's filters it writes the
topology of every endpoint, and of the peer endpoint another profile chose (P/D's decode pick), under
TOPOLOGIES, which the topology-affinity filter and scorer read.

Labels, each renamable by a parameter: `hostname` (kubernetes.io/hostname), `rack`
(topology.kubernetes.io/rack), `zone` (topology.kubernetes.io/zone), `region`
(topology.kubernetes.io/region). An endpoint with none of them has no topology. llm-d also falls back
to the Pod's spec.hostname when the hostname label is missing; Ray EPP's pods carry no Pod spec, so
give the hostname as a label in the pods file."""

from __future__ import annotations

from pydantic import Field

from scheduler.cycle_state import CycleState
from scheduler.data_keys import DataKey
from scheduler.interfaces import Parameters, PluginHandle, Producer
from scheduler.plugins.support.topology import Topology, peer_endpoint
from scheduler.registry import register
from scheduler.types import Endpoint, LLMRequest

# Per endpoint name (the profile's endpoints and the peer), its topology; None: it has none.
TOPOLOGIES: DataKey[dict[str, Topology | None]] = DataKey("endpoint-topologies", "topology-extractor")


class TopologyExtractorParameters(Parameters):
    # llm-d treats an empty label name as "use the default".
    hostname: str = Field(default="")
    rack: str = Field(default="")
    zone: str = Field(default="")
    region: str = Field(default="")


@register
class TopologyExtractor(Producer):
    type_name = "topology-extractor"
    Parameters = TopologyExtractorParameters

    def setup(self, handle: PluginHandle) -> None:
        p = self.params
        self.labels = (
            p.hostname or "kubernetes.io/hostname",
            p.rack or "topology.kubernetes.io/rack",
            p.zone or "topology.kubernetes.io/zone",
            p.region or "topology.kubernetes.io/region",
        )
        self.produces = (TOPOLOGIES.of(self.name),)

    def produce(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> None:
        topologies = {ep.name: self.topology(ep) for ep in endpoints}
        peer = peer_endpoint(cycle_state)
        if peer is not None:
            topologies[peer.name] = self.topology(peer)
        cycle_state.put(self.produces[0], topologies)

    def topology(self, endpoint: Endpoint) -> Topology | None:
        values = [endpoint.labels.get(label, "") for label in self.labels]
        return Topology(*values) if any(values) else None


def topologies_key(handle: PluginHandle, name: str) -> DataKey[dict[str, Topology | None]]:
    """The key a consumer reads: that of the extractor `name` names (topologyProducerName), else the
    one named after the type. llm-d only warns when there is none and then never filters or scores;
    here that is a load-time error."""
    extractor = handle.plugin_of_type(name or TopologyExtractor.type_name, TopologyExtractor, "topologyProducerName")
    return extractor.produces[0]
