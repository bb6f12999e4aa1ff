"""Where an endpoint sits (host, rack, zone, region) and how close two endpoints are: shared by
`topology-extractor`, `topology-affinity-filter` and `topology-affinity-scorer` (llm-d's
pkg/epp/framework/plugins/scheduling/util/topology/level.go and peer.go, datalayer/attribute/topology).

The peer is the endpoint an earlier profile of the same request chose: `disagg-profile-handler`
writes the decode pick under PEER_ENDPOINT_KEY before it runs the prefill profile (llm-d's
`peer-endpoint` request attribute). The CycleState travels with each profile call, so a profile
actor sees it too."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from scheduler.cycle_state import CycleState
from scheduler.types import Endpoint

PEER_ENDPOINT_KEY = "disagg/peer-endpoint"


class Level(IntEnum):
    """The tightest tier two endpoints share; lower is closer (llm-d's order)."""

    HOST = 0
    RACK = 1
    ZONE = 2
    REGION = 3
    NONE = 4

    @classmethod
    def parse(cls, name: str) -> Level:
        names = {"host": cls.HOST, "rack": cls.RACK, "zone": cls.ZONE, "region": cls.REGION}
        if name not in names:
            raise ValueError(f"invalid topology level {name!r}, must be one of host, rack, zone, region")
        return names[name]


@dataclass(slots=True, frozen=True)
class Topology:
    hostname: str = ""
    rack: str = ""
    zone: str = ""
    region: str = ""

    def level_to(self, other: Topology | None) -> Level:
        """The tightest tier shared with `other`, checked host first; an empty value never matches,
        not even another empty one."""
        if other is None:
            return Level.NONE
        for level, mine, theirs in (
            (Level.HOST, self.hostname, other.hostname),
            (Level.RACK, self.rack, other.rack),
            (Level.ZONE, self.zone, other.zone),
            (Level.REGION, self.region, other.region),
        ):
            if mine and mine == theirs:
                return level
        return Level.NONE


def peer_endpoint(cycle_state: CycleState) -> Endpoint | None:
    peer = cycle_state.read(PEER_ENDPOINT_KEY)
    return peer if isinstance(peer, Endpoint) else None
