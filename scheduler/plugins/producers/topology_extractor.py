"""`topology-extractor` (llm-d's pkg/epp/framework/plugins/datalayer/extractor/topology/extractor.go):
an endpoint's Topology from its pod labels, read by the topology-affinity filter and scorer.

Labels, each renamable by a parameter: `hostname` (kubernetes.io/hostname), `rack`
(topology.kubernetes.io/rack), `zone` (topology.kubernetes.io/zone), `region`
(topology.kubernetes.io/region). An endpoint with none of them has no topology. llm-d also falls back
to the Pod's spec.hostname when the hostname label is missing; Ray EPP's pods carry no Pod spec, so
give the hostname as a label in the pods file."""

from __future__ import annotations

from pydantic import Field

from scheduler.interfaces import Parameters, Plugin, PluginHandle
from scheduler.plugins.support.topology import Topology
from scheduler.registry import register
from scheduler.types import Endpoint


class TopologyExtractorParameters(Parameters):
    # llm-d treats an empty label name as "use the default".
    hostname: str = Field(default="")
    rack: str = Field(default="")
    zone: str = Field(default="")
    region: str = Field(default="")


@register
class TopologyExtractor(Plugin):
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

    def topology(self, endpoint: Endpoint) -> Topology | None:
        values = [endpoint.labels.get(label, "") for label in self.labels]
        return Topology(*values) if any(values) else None


def topology_producer(handle: PluginHandle, name: str) -> TopologyExtractor:
    """The extractor a consumer reads: `name` (topologyProducerName), else the one named after the type.
    llm-d only warns when there is none and then never filters or scores; here that is a load-time error."""
    return handle.plugin_of_type(name or TopologyExtractor.type_name, TopologyExtractor, "topologyProducerName")
