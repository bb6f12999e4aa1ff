"""The gateway as a Ray Serve application builder, for `serve run` and Serve config files:

    RAY_SERVE_THROUGHPUT_OPTIMIZED=1 serve run serve_app.app:build_app config=default pods=pods.yaml
    serve run ray_epp/examples/serve_config.yaml

Args: `config` (a shipped config's name, a path or YAML text; default `default`), `pods` (pods file,
required), `settings` (gateway settings YAML, optional), `replicas` (default 1),
`max_replicas_per_node` (Serve's; 1 puts every replica on a node of its own), `host` and `port`
(the address every replica serves itself, default 127.0.0.1:8000; `port: none` leaves only Serve's
proxy), `ext_proc_port` (also serve GIE's Endpoint Picker Protocol, Envoy ext_proc over gRPC, on
that port: docs/EXT_PROC.md), `profile_shards` (actors per scheduling profile, default 1), `detached` (default true: the
actors outlive the process that built the app, as `serve deploy` needs). Set
RAY_SERVE_ENABLE_DIRECT_INGRESS=0 in the cluster's environment when RAY_SERVE_THROUGHPUT_OPTIMIZED=1
(its direct ingress would take the same port)."""

from __future__ import annotations

from typing import Any

from ray.serve import Application

from actors.launcher import ActorOptions, load_pods_file, start_epp_actors
from actors.metrics_hub import get_or_create_hub
from actors.package_check import require_package_on_every_node
from actors.placement import PLACED_MIN_CPUS
from ray_epp import __version__
from scheduler import dump_config, load_config_file
from serve_app.cli.launch import DEFAULT_CONFIG, decision_log_for
from serve_app.gateway.deployment import Gateway
from serve_app.gateway.local_runner import check_in_replica
from serve_app.gateway.settings import GatewaySettings, load_settings_file


def build_app(args: dict[str, Any]) -> Application:
    if not args.get("pods"):
        raise ValueError("build_app needs pods=<pods file> (a YAML/JSON list of {name, address, port, labels})")
    cfg = load_config_file(args.get("config") or DEFAULT_CONFIG)
    settings = load_settings_file(args["settings"]) if args.get("settings") else GatewaySettings()
    detached = str(args.get("detached", "true")).lower() in ("1", "true", "yes")
    options = ActorOptions(detached=detached, profile_shards=int(args.get("profile_shards", 1)))
    if settings.decide_in_replica:  # refused before anything starts, as `epp up` does
        check_in_replica(cfg, options.profile_shards)
    require_package_on_every_node(__version__)  # before anything is placed on a node that lacks it
    actors = start_epp_actors(
        dump_config(cfg), load_pods_file(args["pods"]), options=options, decide_in=settings.decide_in
    )
    port = str(args.get("port", 8000)).lower()
    ingress = None if port in ("none", "0", "") else {"host": args.get("host") or "127.0.0.1", "port": int(port)}
    if args.get("ext_proc_port"):
        if ingress is None:
            raise ValueError("ext_proc_port needs the gateway port (port): every replica serves both")
        ingress["ext_proc_port"] = int(args["ext_proc_port"])
    replicas = {"num_replicas": int(args.get("replicas", 1))}
    if args.get("max_replicas_per_node"):  # e.g. 1: no node's loss takes two replicas
        replicas["max_replicas_per_node"] = int(args["max_replicas_per_node"])
    # a little CPU, so that Serve's spreading of the replicas over the nodes is not ignored
    return Gateway.options(**replicas, ray_actor_options={"num_cpus": PLACED_MIN_CPUS}).bind(
        dump_config(cfg),
        settings.model_dump(),
        actors.datastore,
        actors.gateway_shards(),
        get_or_create_hub(),
        ingress,
        decision_log_for(settings),
    )
