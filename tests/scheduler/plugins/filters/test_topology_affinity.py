"""topology-extractor, topology-affinity-filter and -scorer: llm-d's cases (filter_test.go,
scorer_test.go, level_test.go in llm-d/llm-d-router pkg/epp/framework/plugins/scheduling) as a
table, and the peer the disagg handler publishes before the prefill profile runs."""

from __future__ import annotations

import pytest

from scheduler.config import load_config
from scheduler.errors import ConfigError
from scheduler.interfaces import PluginHandle
from scheduler.plugins.filters.topology_affinity import TopologyAffinityFilter
from scheduler.plugins.producers.topology_extractor import TopologyExtractor
from scheduler.plugins.scorers.topology_affinity import TopologyAffinityScorer
from scheduler.plugins.support.topology import PEER_ENDPOINT_KEY, Level, Topology
from tests.scheduler.helpers import endpoint, fresh_state, names, request

HOST, RACK, ZONE, REGION = (
    "kubernetes.io/hostname",
    "topology.kubernetes.io/rack",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
)


def at(name, host="", rack="", zone="", region=""):
    labels = {k: v for k, v in ((HOST, host), (RACK, rack), (ZONE, zone), (REGION, region)) if v}
    return endpoint(name, labels)


PEER = at("decode", host="h1", rack="r1", zone="z1", region="eu")
CANDIDATES = [
    at("same-host", host="h1", rack="r1", zone="z1", region="eu"),
    at("same-rack", host="h2", rack="r1", zone="z1", region="eu"),
    at("same-zone", host="h3", rack="r2", zone="z1", region="eu"),
    at("same-region", host="h4", rack="r3", zone="z2", region="eu"),
    at("far", host="h5", rack="r4", zone="z3", region="us"),
    at("unlabelled"),
]


@pytest.mark.parametrize(
    ("a", "b", "level"),
    [
        (Topology("h1", "r1", "z1", "eu"), Topology("h1", "r9", "z9", "us"), Level.HOST),  # host wins outright
        (Topology("h1", "r1"), Topology("h2", "r1"), Level.RACK),
        (Topology(zone="z1"), Topology(zone="z1"), Level.ZONE),
        (Topology(region="eu"), Topology(region="eu"), Level.REGION),
        (Topology(), Topology(), Level.NONE),  # empty never matches empty
        (Topology("h1"), None, Level.NONE),
    ],
)
def test_levels(a, b, level):
    assert a.level_to(b) is level


def built(cls, params=None, extractor=None):
    extractor = extractor or TopologyExtractor()
    handle = PluginHandle(lambda n: {"topology-extractor": extractor}[n], ["topology-extractor"])
    return cls(params=cls.Parameters.model_validate(params or {}), handle=handle)


def with_peer(peer):
    """A cycle state with the peer the handler published and what the extractor then wrote, as the
    profile runs its producers before its filters."""
    state = fresh_state()
    if peer is not None:
        state.write(PEER_ENDPOINT_KEY, peer)
    TopologyExtractor().produce(state, request(), CANDIDATES)
    return state


@pytest.mark.parametrize(
    ("min_affinity", "peer", "want"),
    [
        ("host", PEER, ["same-host"]),
        ("rack", PEER, ["same-host", "same-rack"]),
        ("zone", PEER, ["same-host", "same-rack", "same-zone"]),
        ("region", PEER, ["same-host", "same-rack", "same-zone", "same-region"]),
        ("host", None, [c.name for c in CANDIDATES]),  # no peer: fail open
        ("host", at("decode"), [c.name for c in CANDIDATES]),  # peer without topology: fail open
        ("host", at("decode", host="h9"), [c.name for c in CANDIDATES]),  # nobody close enough: fail open
    ],
)
def test_filter(min_affinity, peer, want):
    f = built(TopologyAffinityFilter, {"minAffinity": min_affinity})
    assert names(f.filter(with_peer(peer), request(), CANDIDATES)) == want


def test_filter_drops_candidates_without_topology_when_others_match():
    f = built(TopologyAffinityFilter, {"minAffinity": "region"})
    kept = names(f.filter(with_peer(PEER), request(), CANDIDATES))
    assert "unlabelled" not in kept and "far" not in kept


@pytest.mark.parametrize(
    ("peer", "want"),
    [
        (PEER, [1.0, 0.2, 0.05, 0.02, 0.0, 0.0]),
        (None, [0.0] * 6),
        (at("decode"), [0.0] * 6),
    ],
)
def test_scorer(peer, want):
    s = built(TopologyAffinityScorer)
    scores = s.score(with_peer(peer), request(), CANDIDATES)
    assert [scores[c] for c in CANDIDATES] == want


def test_extractor_label_names_are_parameters():
    ex = TopologyExtractor(params=TopologyExtractor.Parameters(hostname="node", zone="az"))
    assert ex.topology(endpoint("p", {"node": "n1", "az": "a", HOST: "ignored"})) == Topology("n1", "", "a", "")
    assert ex.topology(endpoint("p", {})) is None


@pytest.mark.parametrize(
    ("plugins", "expect"),
    [
        ([{"type": "topology-affinity-filter"}], "topologyProducerName 'topology-extractor' names no plugin"),
        (
            [
                {"type": "queue-scorer"},
                {"type": "topology-affinity-scorer", "parameters": {"topologyProducerName": "queue-scorer"}},
            ],
            "is a queue-scorer, not a topology-extractor",
        ),
        (
            [
                {"type": "topology-extractor"},
                {"type": "topology-affinity-filter", "parameters": {"minAffinity": "row"}},
            ],
            "invalid topology level 'row'",
        ),
    ],
)
def test_config_mistakes(plugins, expect):
    with pytest.raises(ConfigError, match=expect.replace("(", r"\(").replace(")", r"\)")):
        load_config({"plugins": plugins})
