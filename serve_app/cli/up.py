"""`epp up`: start Ray (or join one), the actors and the gateway; Ctrl-C stops it all.

With no arguments: a local Ray on 127.0.0.1, 4 simulated vLLM pods, the shipped `default` config, the
gateway on 127.0.0.1:8000."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time

from serve_app.cli.launch import DEFAULT_CONFIG


def add_up_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        default=DEFAULT_CONFIG,
        help="EndpointPickerConfig: a shipped config's name (default, gie-default, pd, lora, ...), a path "
        "or YAML text (default: %(default)s)",
    )
    p.add_argument(
        "--pods",
        help="pods file (YAML/JSON list of {name, address, port, labels}); without it, simulated pods are started",
    )
    p.add_argument(
        "--watch-pods",
        action="store_true",
        help="reload the pods file when it changes (add, remove, relabel); an invalid file keeps the last good pods",
    )
    p.add_argument("--sim-pods", type=int, default=4, help="how many simulated pods without --pods (default 4)")
    p.add_argument("--sim-time-scale", type=float, default=1.0, help="simulated latency scale (default 1.0)")
    p.add_argument("--settings", help="gateway settings YAML (objectives, limits, retries)")
    p.add_argument("--address", help="join an existing Ray cluster (e.g. auto or ray://host:10001)")
    p.add_argument("--host", default="127.0.0.1", help="HTTP host (default %(default)s)")
    p.add_argument("--port", type=int, default=8000, help="HTTP port (default %(default)s)")
    p.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="gateway replicas (default 1), all serving --port; with 2 or more the port survives a replica's death",
    )
    p.add_argument(
        "--profile-shards",
        type=int,
        default=1,
        help="actors per scheduling profile (default 1); a request goes to one by its prompt's first block",
    )
    p.add_argument(
        "--proxy-port",
        type=int,
        default=None,
        help="Ray Serve's proxy, which balances over all replicas (default --port + 88, i.e. 8088)",
    )
    p.add_argument(
        "--ext-proc-port",
        type=int,
        default=None,
        help="also serve GIE's Endpoint Picker Protocol (Envoy ext_proc over gRPC) on this port, every replica "
        "active (docs/EXT_PROC.md)",
    )
    p.add_argument(
        "--metrics-actor-scope",
        choices=("node", "pod"),
        default="node",
        help="one metrics actor per Ray node's pods (default) or one per pod",
    )
    p.add_argument(
        "--dashboard",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="Ray's dashboard on 127.0.0.1 with the local Ray (default on; needed by `ray list` and `serve status`)",
    )
    p.add_argument("--exit-after", type=float, default=None, help=argparse.SUPPRESS)  # for tests: stop after N s


def run_up(args: argparse.Namespace) -> int:
    from serve_app.cli.launch import EppDeployment, LaunchError, LaunchSpec

    try:
        spec = LaunchSpec(
            config_path=args.config,
            pods_path=args.pods,
            watch_pods=args.watch_pods,
            sim_pods=args.sim_pods,
            sim_time_scale=args.sim_time_scale,
            settings_path=args.settings,
            address=args.address,
            host=args.host,
            port=args.port,
            replicas=args.replicas,
            profile_shards=args.profile_shards,
            proxy_port=args.proxy_port,
            ext_proc_port=args.ext_proc_port,
            actor_options={"metrics_actor_scope": args.metrics_actor_scope},
            dashboard=args.dashboard,
        )
        deployment = EppDeployment.start(spec)
    except (LaunchError, ValueError) as err:  # pydantic's ValidationError is a ValueError
        print(f"epp up: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C while starting: `start` has stopped what it had started
        print("epp up: interrupted while starting; everything it had started is stopped", file=sys.stderr)
        return 130
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    url = deployment.url
    model = deployment.example_model()
    access = _operator_access(deployment, args.port)
    ext_proc = (
        f"  ext_proc (Envoy, GIE's Endpoint Picker Protocol): grpc://{deployment.ext_proc_address}\n"
        if deployment.ext_proc_address
        else ""
    )
    print(
        f"""
Ray EPP is up: {url}  ({len(deployment.pods)} pods, {args.replicas} gateway replica(s), config {args.config})
  curl -s {url}/v1/completions -H 'content-type: application/json' \\
    -d '{{"model": "{model}", "prompt": "Hello, my name is", "max_tokens": 16}}'
  metrics: {url}/metrics   ready: {url}/ready   models: {url}/v1/models
{ext_proc}{access}Ctrl-C stops everything.""",
        flush=True,
    )
    try:
        _wait(stop, deployment, args.exit_after)
    finally:
        print("epp up: shutting down", flush=True)
        if deployment.owns_ray:
            from serve_app.admin.operator_access import remove_access

            remove_access(args.port, os.getpid())
        deployment.stop()
    return 0


def _operator_access(deployment, port: int) -> str:
    """The console lines for `ray status`, `ray list actors`, `serve status` and a Python driver
    (serve_app/admin/operator_access.py), and the file `epp env` reads; none for a joined cluster,
    whose operators already reach it."""
    if not deployment.owns_ray:
        return ""
    from serve_app.admin.operator_access import current_access, write_access

    access = current_access()
    write_access(port, access)
    dashboard = f"  dashboard: {access.dashboard_url}\n" if access.dashboard_url else ""
    return (
        f"{dashboard}  Ray tools (ray status, ray list actors, serve status, ray.init()) from another shell:\n"
        f"    eval \"$(epp env --port {port})\"    # that is: {access.shell_line()}\n"
    )


def _wait(stop: threading.Event, deployment, exit_after: float | None) -> None:
    """Until Ctrl-C (or exit_after): and say on the console when a watched pods file turns invalid
    (the datastore keeps its last good pods) or is valid again."""
    deadline = None if exit_after is None else time.monotonic() + exit_after
    shown: dict[str, str] = {}
    while not stop.wait(2.0 if deadline is None else max(0.0, min(2.0, deadline - time.monotonic()))):
        if deadline is not None and time.monotonic() >= deadline:
            return
        try:
            errors = deployment.pod_source_errors()
        except Exception:  # the datastore restarting: ask again next time
            continue
        for source, error in errors.items():
            if shown.get(source) != error:
                print(f"epp up: ERROR pod source {source}: {error}; keeping the last good pods", file=sys.stderr)
        for source in set(shown) - set(errors):
            print(f"epp up: pod source {source} is valid again", file=sys.stderr, flush=True)
        shown = errors
