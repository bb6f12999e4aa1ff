"""Start and stop the EPP actors: the datastore (with its metrics actors, one per Ray node's pods)
and one profile actor per scheduling profile of the config (or `profile_shards` of them); none
for a profile the gateway replicas decide themselves (`decide_in_replica`)."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import ray

from actors.datastore import DatastoreActor
from actors.options import ActorOptions, PodSpec, as_options, as_pod, with_data_layer
from actors.placement import affinity, placed_cpus, prefer_labels
from actors.pods_file import PodsFileError, load_pods_file, parse_pods
from actors.profile_actor import ProfileActor, config_digest
from actors.protocol import StandbyPair
from actors.standby import in_group, pair_group, remove_pair_group, standby_name, wants_standby
from scheduler import EndpointPickerConfig, dump_config, load_config
from scheduler.config import DecideIn, build_plugins
from scheduler.config.sections import data_layer_actor_options

__all__ = [
    "ActorOptions",
    "EppActors",
    "PodSpec",
    "PodsFileError",
    "load_pods_file",
    "parse_pods",
    "profile_actor_name",
    "router_profile_actor_name",
    "start_epp_actors",
    "start_router_profile_actors",
    "stop_epp_actors",
    "stop_router_profile_actors",
]


def profile_actor_name(datastore_name: str, profile: str, shard: int = 0) -> str:
    """Shard 0 keeps the unsharded name, so one shard is exactly the actor of old."""
    base = f"{datastore_name}:profile:{profile}"
    return base if shard == 0 else f"{base}:shard:{shard}"


@dataclass
class EppActors:
    """`profiles`: each profile's first shard (its only actor unless `profile_shards` > 1);
    `shards`: every shard's actor, per profile; `standbys`: each shard's standby, per profile
    (empty without standbys: actors/standby.py). A gateway gets `gateway_shards()`."""

    datastore: Any
    profiles: dict[str, Any]
    datastore_name: str
    config: EndpointPickerConfig
    namespace: str | None = None
    options: ActorOptions = field(default_factory=ActorOptions)
    shards: dict[str, list[Any]] = field(default_factory=dict)
    standbys: dict[str, list[Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.shards:
            self.shards = {name: [actor] for name, actor in self.profiles.items()}

    def all_profile_actors(self) -> list[Any]:
        """Every profile actor, the standbys included."""
        return [actor for group in (self.shards, self.standbys) for actors in group.values() for actor in actors]

    def gateway_shards(self) -> dict[str, list[Any]]:
        """Each profile's shards as a gateway takes them: a `StandbyPair` where there is a standby."""
        if not self.standbys:
            return self.shards
        return {
            name: [StandbyPair(a, b) for a, b in zip(actors, self.standbys[name], strict=True)]
            for name, actors in self.shards.items()
        }


def start_epp_actors(
    config: EndpointPickerConfig | dict[str, Any] | str,
    pods: list[PodSpec | dict[str, Any]],
    *,
    options: ActorOptions | dict[str, Any] | None = None,
    namespace: str | None = None,
    timeout_s: float = 60.0,
    pod_sources: list[dict[str, Any]] | None = None,
    decide_in: DecideIn = DecideIn.PROFILE_ACTORS,
) -> EppActors:
    """Create (or reuse) the named datastore, make its pod set `pods`, and start one profile actor
    per profile of `config` that needs one; return once the pods were scraped once (or `timeout_s`
    passed) and every profile actor holds a snapshot that includes that. `pod_sources`
    (actors/pod_source.py, e.g. `[{"kind": "file", "path": ...}]`) are run by a new datastore, placed
    on this node so that it reads the same files; a reused one keeps its own. `decide_in`: who runs
    the profiles; when the gateway replicas do, only a profile with a plugin that the replica can
    not run gets actors (scheduler/config/placement.py; the launcher refuses such a config before),
    and an earlier launch's profile actors of this datastore are ended. Needs `ray.init()` first."""
    cfg = load_config(config)
    opts = with_data_layer(as_options(options), data_layer_actor_options(cfg))
    specs = [as_pod(p) for p in pods]
    ns = namespace or ray.get_runtime_context().namespace
    deadline = time.monotonic() + timeout_s
    lifetime = "detached" if opts.detached else None
    # A datastore that runs pod sources reads their files: it prefers this node (soft).
    strategy = prefer_labels(opts.datastore_node_labels) or (
        affinity(ray.get_runtime_context().get_node_id()) if pod_sources else None
    )
    datastore = DatastoreActor.options(
        name=opts.datastore_name,
        namespace=ns,
        get_if_exists=True,
        lifetime=lifetime,
        max_restarts=-1,
        num_cpus=placed_cpus(opts.datastore_num_cpus, strategy),
        scheduling_strategy=strategy,
    ).remote([s.model_dump() for s in specs], opts.model_dump(), opts.datastore_name, ns, pod_sources)
    ray.get(datastore.ping.remote(), timeout=_left(deadline))
    ray.get(datastore.set_pods.remote([s.model_dump() for s in specs]), timeout=_left(deadline))

    dumped = dump_config(cfg)
    digest = config_digest(dumped)
    in_actors = _profiles_in_actors(cfg, decide_in)
    names = {
        spec.name: [profile_actor_name(opts.datastore_name, spec.name, i) for i in range(opts.profile_shards)]
        for spec in cfg.scheduling_profiles
        if spec.name in in_actors
    }
    groups = _pair_groups(names, lifetime, opts, deadline)
    shards: dict[str, list[Any]] = {}
    standbys: dict[str, list[Any]] = {}
    for profile, actor_names in names.items():
        shards[profile] = [
            _profile_actor(name, ns, lifetime, opts, dumped, profile, groups.get(name), 0) for name in actor_names
        ]
        if groups:
            standbys[profile] = [
                _profile_actor(standby_name(name), ns, lifetime, opts, dumped, profile, groups[name], 1)
                for name in actor_names
            ]
    for role, actors_of in ((0, shards), (1, standbys)):
        _check_digests(actors_of, digest, ns, lifetime, opts, dumped, deadline, groups, role)
    _kill_extra_shards(cfg, opts, ns, with_standbys=not groups, started=names)  # an earlier launch's extra actors go

    everyone = [a for group in (shards, standbys) for actors in group.values() for a in actors]
    version = ray.get(datastore.wait_settled.remote(max(0.0, min(10.0, _left(deadline) - 1.0))))
    ray.get([a.ready.remote(version) for a in everyone], timeout=_left(deadline))
    profiles = {name: actors[0] for name, actors in shards.items()}
    return EppActors(datastore, profiles, opts.datastore_name, cfg, ns, opts, shards, standbys)


def _profiles_in_actors(cfg: EndpointPickerConfig, decide_in: DecideIn) -> set[str]:
    if decide_in is DecideIn.PROFILE_ACTORS:  # every profile: no need to build the plugins here
        return {spec.name for spec in cfg.scheduling_profiles}
    return set(build_plugins(cfg, decide_in=decide_in).profiles_in_actors())


def _pair_groups(
    names: dict[str, list[str]], lifetime: str | None, opts: ActorOptions, deadline: float
) -> dict[str, Any]:
    """Each profile actor's placement group with its standby (actors/standby.py), or {} for none."""
    if not wants_standby(opts, ray.nodes()):
        return {}
    groups = {}
    for name in (n for actor_names in names.values() for n in actor_names):
        group = pair_group(name, lifetime, opts, min(10.0, _left(deadline)))
        if group is None:
            for placed in groups:
                remove_pair_group(placed)
            return {}
        groups[name] = group
    return groups


def _profile_actor(
    name: str,
    ns: str,
    lifetime: str | None,
    opts: ActorOptions,
    dumped: dict[str, Any],
    profile: str,
    group: Any = None,
    bundle: int = 0,
) -> Any:
    options = _profile_actor_options(name, ns, lifetime, opts, group, bundle)
    return ProfileActor.options(get_if_exists=True, **options).remote(
        dumped, profile, opts.datastore_name, ns, opts.model_dump()
    )


def _profile_actor_options(
    name: str, ns: str, lifetime: str | None, opts: ActorOptions, group: Any = None, bundle: int = 0
) -> dict[str, Any]:
    """A profile actor's options: in its bundle of the pair's placement group when it has a
    standby, else on the profile's preferred nodes."""
    strategy = in_group(group, bundle) if group is not None else prefer_labels(opts.profile_node_labels)
    options: dict[str, Any] = {
        "name": name,
        "namespace": ns,
        "lifetime": lifetime,
        "max_restarts": -1,
        "max_task_retries": opts.profile_max_task_retries,
        "num_cpus": placed_cpus(opts.profile_num_cpus, strategy),
    }
    if strategy is not None:
        options["scheduling_strategy"] = strategy
    return options


def _check_digests(
    shards: dict[str, list[Any]],
    digest: str,
    ns: str,
    lifetime: str | None,
    opts: ActorOptions,
    dumped: dict[str, Any],
    deadline: float,
    groups: dict[str, Any],
    bundle: int,
) -> None:
    """An actor of one of these names that runs another config is replaced."""
    for profile, actors in shards.items():
        infos = ray.get([a.info.remote() for a in actors], timeout=_left(deadline))
        for i, info in enumerate(infos):
            if info["config_digest"] != digest:
                ray.kill(actors[i], no_restart=True)
                name = profile_actor_name(opts.datastore_name, profile, i)
                actor_name = standby_name(name) if bundle else name
                options = _profile_actor_options(actor_name, ns, lifetime, opts, groups.get(name), bundle)
                args = (dumped, profile, opts.datastore_name, ns, opts.model_dump())
                actors[i] = _create_when_name_free(options, args, deadline)


def _kill_extra_shards(
    cfg: EndpointPickerConfig, opts: ActorOptions, ns: str, with_standbys: bool, started: dict[str, list[str]]
) -> None:
    """Shards past `profile_shards` left by an earlier launch (detached actors outlive it) would
    keep watching the datastore: end them, their standbys too (every standby when `with_standbys`:
    this launch has none); every shard of a profile this launch started no actor for (`started`)."""
    for spec in cfg.scheduling_profiles:
        kept = len(started.get(spec.name, ()))
        i = 0 if with_standbys else kept
        while True:
            name = profile_actor_name(opts.datastore_name, spec.name, i)
            found = [_kill_named(standby_name(name), ns)]
            if i >= kept:  # its group goes too (a reused actor below stays in its own)
                found.append(_kill_named(name, ns))
                remove_pair_group(name)
            if not any(found) and i >= kept:
                break
            i += 1


def _kill_named(name: str, ns: str) -> bool:
    try:
        actor = ray.get_actor(name, namespace=ns)
    except ValueError:
        return False
    ray.kill(actor, no_restart=True)
    return True


def _create_when_name_free(actor_options: dict[str, Any], args: tuple, deadline: float) -> Any:
    while True:
        try:
            return ProfileActor.options(**actor_options).remote(*args)
        except ValueError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _left(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("timed out starting the EPP actors")
    return left


def stop_epp_actors(actors: EppActors) -> None:
    """Kill the profile actors (their standbys too), the metrics actors and the datastore (no restarts)."""
    for actor in actors.all_profile_actors():
        with contextlib.suppress(Exception):
            ray.kill(actor, no_restart=True)
    for profile, shards in actors.shards.items():
        for i in range(len(shards) if actors.standbys else 0):
            remove_pair_group(profile_actor_name(actors.datastore_name, profile, i))
    try:
        ray.get(actors.datastore.shutdown.remote(), timeout=30)
    finally:
        with contextlib.suppress(Exception):
            ray.kill(actors.datastore, no_restart=True)


def router_profile_actor_name(config_digest_: str, profile: str) -> str:
    return f"epp-router:{config_digest_}:profile:{profile}"


def start_router_profile_actors(
    config: EndpointPickerConfig | dict[str, Any] | str,
    *,
    namespace: str,
    options: ActorOptions | dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The profile actors of a Serve request router's config, found by name or created: every
    router (one per deployment handle, in every ingress replica) that runs this config shares them,
    and so shares the prefix index, in-flight ledgers and LoRA residency. They have no datastore:
    each call brings its endpoints (the router's replicas). Named by the config's digest, so another
    config gets other actors; detached, so they outlive any one router (`stop_router_profile_actors`
    ends them). Makes GCS calls but waits for no actor: callers on an event loop run it in a thread."""
    opts = as_options(options)
    cfg = load_config(config)
    dumped = dump_config(cfg)
    digest = config_digest(dumped)
    actors: dict[str, Any] = {}
    for spec in cfg.scheduling_profiles:
        actors[spec.name] = ProfileActor.options(
            name=router_profile_actor_name(digest, spec.name),
            namespace=namespace,
            get_if_exists=True,
            lifetime="detached",
            max_restarts=-1,
            max_task_retries=opts.profile_max_task_retries,
            num_cpus=opts.profile_num_cpus,
        ).remote(dumped, spec.name, None, namespace, opts.model_dump())
    return actors


def stop_router_profile_actors(config: EndpointPickerConfig | dict[str, Any] | str, *, namespace: str) -> int:
    """Kill a router config's profile actors (no restarts); returns how many there were."""
    cfg = load_config(config)
    digest = config_digest(dump_config(cfg))
    killed = 0
    for spec in cfg.scheduling_profiles:
        try:
            actor = ray.get_actor(router_profile_actor_name(digest, spec.name), namespace=namespace)
        except ValueError:
            continue
        ray.kill(actor, no_restart=True)
        killed += 1
    return killed
