"""Start and stop the EPP actors: the datastore (with its metrics actors, one per Ray node's pods)
and one profile actor per scheduling profile of the config. Also reads a pods file."""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
import yaml
from pydantic import ValidationError

from actors.datastore import DatastoreActor
from actors.options import ActorOptions, PodSpec, as_options, as_pod
from actors.profile_actor import ProfileActor, config_digest
from scheduler import EndpointPickerConfig, dump_config, load_config
from scheduler.config.nesting import MAX_FILE_NESTING, nests_deeper_than

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


def profile_actor_name(datastore_name: str, profile: str) -> str:
    return f"{datastore_name}:profile:{profile}"


@dataclass
class EppActors:
    datastore: Any
    profiles: dict[str, Any]
    datastore_name: str
    config: EndpointPickerConfig
    namespace: str | None = None
    options: ActorOptions = field(default_factory=ActorOptions)


def start_epp_actors(
    config: EndpointPickerConfig | dict[str, Any] | str,
    pods: list[PodSpec | dict[str, Any]],
    *,
    options: ActorOptions | dict[str, Any] | None = None,
    namespace: str | None = None,
    timeout_s: float = 60.0,
) -> EppActors:
    """Create (or reuse) the named datastore, make its pod set `pods`, and start one profile actor
    per profile of `config`; return once the pods were scraped once (or `timeout_s` passed) and every
    profile actor holds a snapshot that includes that. Needs `ray.init()` first."""
    opts = as_options(options)
    cfg = load_config(config)
    specs = [as_pod(p) for p in pods]
    ns = namespace or ray.get_runtime_context().namespace
    deadline = time.monotonic() + timeout_s
    lifetime = "detached" if opts.detached else None
    datastore = DatastoreActor.options(
        name=opts.datastore_name,
        namespace=ns,
        get_if_exists=True,
        lifetime=lifetime,
        max_restarts=-1,
        num_cpus=opts.datastore_num_cpus,
    ).remote([s.model_dump() for s in specs], opts.model_dump(), opts.datastore_name, ns)
    ray.get(datastore.ping.remote(), timeout=_left(deadline))
    ray.get(datastore.set_pods.remote([s.model_dump() for s in specs]), timeout=_left(deadline))

    dumped = dump_config(cfg)
    digest = config_digest(dumped)
    profiles: dict[str, Any] = {}
    for spec in cfg.scheduling_profiles:
        name = profile_actor_name(opts.datastore_name, spec.name)
        actor_options = {
            "name": name,
            "namespace": ns,
            "lifetime": lifetime,
            "max_restarts": -1,
            "max_task_retries": opts.profile_max_task_retries,
            "num_cpus": opts.profile_num_cpus,
        }
        args = (dumped, spec.name, opts.datastore_name, ns, opts.model_dump())
        actor = ProfileActor.options(get_if_exists=True, **actor_options).remote(*args)
        if ray.get(actor.info.remote(), timeout=_left(deadline))["config_digest"] != digest:
            ray.kill(actor, no_restart=True)  # an actor of this name runs another config: replace it
            actor = _create_when_name_free(actor_options, args, deadline)
        profiles[spec.name] = actor

    version = ray.get(datastore.wait_settled.remote(max(0.0, min(10.0, _left(deadline) - 1.0))))
    ray.get([a.ready.remote(version) for a in profiles.values()], timeout=_left(deadline))
    return EppActors(datastore, profiles, opts.datastore_name, cfg, ns, opts)


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
    """Kill the profile actors, the metrics actors and the datastore (no restarts)."""
    for actor in actors.profiles.values():
        with contextlib.suppress(Exception):
            ray.kill(actor, no_restart=True)
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


class PodsFileError(ValueError):
    """A pods file that can not be used; the message names the file, the entry and the field."""


def load_pods_file(path: str | Path) -> list[PodSpec]:
    """Pods from a YAML or JSON file: a list of {name, address, port, labels}, or {pods: [...]}."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise PodsFileError(f"can not read pods file {str(path)!r}: {err.strerror}") from None
    except UnicodeDecodeError as err:
        raise PodsFileError(f"pods file {str(path)!r} is not UTF-8 text: {err}") from None
    kind = "JSON" if path.suffix == ".json" else "YAML"
    if nests_deeper_than(text):
        raise PodsFileError(f"pods file {str(path)!r}: the {kind} nests deeper than {MAX_FILE_NESTING} levels")
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as err:
        raise PodsFileError(f"pods file {str(path)!r} is not valid {kind}: {err}") from None
    except RecursionError:  # json's and PyYAML's parsers recurse once per nesting level
        raise PodsFileError(f"pods file {str(path)!r}: the {kind} nests deeper than the parser can follow") from None
    try:
        return parse_pods(data, where=f"pods file {str(path)!r}")
    except RecursionError:  # parsed just under the limit, then a field's validation went deeper
        raise PodsFileError(f"pods file {str(path)!r}: a value nests too deep") from None


def parse_pods(data: Any, where: str = "pods") -> list[PodSpec]:
    if isinstance(data, dict) and set(data) == {"pods"}:
        data = data["pods"]
    if not isinstance(data, list):
        raise PodsFileError(
            f"{where}: expected a list of pods ({{name, address, port, labels}}), got {type(data).__name__}"
        )
    specs: list[PodSpec] = []
    seen: set[str] = set()
    for i, entry in enumerate(data):
        named = isinstance(entry, dict) and entry.get("name")
        label = f"{where}: entry {i}" + (f" ({entry['name']!r})" if named else "")
        if not isinstance(entry, dict):
            raise PodsFileError(f"{label}: expected a mapping with name, address, port, labels")
        try:
            spec = PodSpec.model_validate(entry)
        except ValidationError as err:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'entry'}: "
                + ("unknown field" if e["type"] == "extra_forbidden" else e["msg"])
                for e in err.errors()
            )
            raise PodsFileError(f"{label}: {problems}") from None
        if spec.name in seen:
            raise PodsFileError(f"{label}: name {spec.name!r} is used by an earlier entry")
        seen.add(spec.name)
        specs.append(spec)
    return specs
