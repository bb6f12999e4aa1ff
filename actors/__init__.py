"""Ray EPP's actors: metrics scrapers (one per Ray node's pods), the datastore, one actor per profile.

from actors import start_epp_actors, stop_epp_actors, PodSpec
epp = start_epp_actors(config, [PodSpec(name="pod-a", address="10.0.0.5", port=8000)])
version, endpoints = ray.get(epp.datastore.snapshot.remote())
outcomes = ray.get(epp.profiles["default"].run_batch.remote([ProfileCall(request, CycleState())]))
"""

from actors.datastore import DatastoreActor
from actors.launcher import EppActors, PodsFileError, load_pods_file, parse_pods, start_epp_actors, stop_epp_actors
from actors.metrics_actor import NodeMetricsActor
from actors.options import ActorOptions, PodSpec
from actors.profile_actor import ProfileActor
from actors.protocol import ProfileCall, ProfileOutcome
from actors.scraper import PodScraper

__all__ = [
    "ActorOptions",
    "DatastoreActor",
    "EppActors",
    "NodeMetricsActor",
    "PodScraper",
    "PodSpec",
    "PodsFileError",
    "ProfileActor",
    "ProfileCall",
    "ProfileOutcome",
    "load_pods_file",
    "parse_pods",
    "start_epp_actors",
    "stop_epp_actors",
]
