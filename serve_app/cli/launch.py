"""Bring up the whole product in one call: Ray, simulated pods (optional), the actors, the
gateway on Serve — and take it all down again, leaving no Ray process behind.

Used by `epp up`, the tests and the benchmarks."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from pydantic import BaseModel, ConfigDict, Field

# Serve's proxy (it balances over replicas but adds ~12 ms) listens here; clients use the gateway
# port, which every replica serves itself (serve_app/gateway/ingress.py).
PROXY_PORT_OFFSET = 88
# A port held by a process that is going away (the last run's replicas) gets this long to free up.
PORT_FREE_WAIT_S = 5.0


def serve_fast_path_env() -> None:
    """Throughput-optimised Serve (DESIGN.md: +1 ms instead of +13 ms) without Serve's direct
    ingress: each gateway replica serves HTTP itself on the shared gateway port. Must be set before
    Ray starts, so Serve's controller and replicas inherit it."""
    os.environ.setdefault("RAY_SERVE_THROUGHPUT_OPTIMIZED", "1")
    # Direct ingress would bind port, port+1, ... itself (without SO_REUSEADDR): ours replaces it.
    os.environ["RAY_SERVE_ENABLE_DIRECT_INGRESS"] = "0"


def serve_direct_ingress_env(port: int, replicas: int) -> None:
    """Serve's own direct ingress (replica i serves HTTP on port + i), for the benchmarks'
    yardstick forwarder. Must be set before Ray starts."""
    os.environ.setdefault("RAY_SERVE_THROUGHPUT_OPTIMIZED", "1")
    os.environ["RAY_SERVE_ENABLE_DIRECT_INGRESS"] = "1"
    os.environ["RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT"] = str(port)
    os.environ["RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT"] = str(port + max(replicas, 1) + 8)
    os.environ.setdefault("RAY_SERVE_PORT_QUARANTINE_S", "0")
    os.environ.setdefault("RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S", "1")
    os.environ.setdefault("RAY_SERVE_DIRECT_INGRESS_MIN_GRPC_PORT", str(port + 200))
    os.environ.setdefault("RAY_SERVE_DIRECT_INGRESS_MAX_GRPC_PORT", str(port + 300))


# Our own Ray's workers send no task events (an interval of 0 turns their buffer off), so its GCS
# stays flat (bench/ray_processes_rss.py) and `ray list tasks` is empty. An operator's
# RAY_task_events_report_interval_ms (1000 is Ray's default) turns them on; the GCS then keeps the
# last GCS_TASK_EVENTS_KEPT tasks (Ray's default: 100,000) and as many evicted attempts' ids.
TASK_EVENTS_REPORT_INTERVAL_MS = "0"
GCS_TASK_EVENTS_KEPT = 10_000


def local_ray_env() -> None:
    """Keep a local Ray's servers on 127.0.0.1 where Ray lets us (README "Network exposure").
    Must be set before Ray starts; its processes inherit it."""
    # ray.init(_node_ip_address="127.0.0.1") alone is turned into the machine's address
    # (services.resolve_ip_for_localhost); with "clusters" off, Ray keeps the loopback address, and
    # then binds the dashboard head's, the autoscaler monitor's and the dashboard agent's
    # Prometheus endpoints and the runtime-env agent to 127.0.0.1 instead of 0.0.0.0 / the node IP.
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def is_loopback_address(address: str) -> bool:
    """A Ray address (`host:port`, `ray://host:port`) on this machine's loopback interface. Joining
    it needs `local_ray_env()`: otherwise Ray rewrites 127.0.0.1 to the machine's IP
    (services.resolve_ip_for_localhost), where a Ray started with `--node-ip-address 127.0.0.1`
    does not listen. `auto` is not loopback: on a real head that would name the wrong node IP."""
    host = address.removeprefix("ray://").rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class LaunchError(RuntimeError):
    """Something the user gave us (config, pods file, settings) or the environment is wrong."""


class LaunchSpec(BaseModel):
    """What to bring up. Config: `config` (a dict) or `config_path` (a shipped config's name, a path
    or YAML text; default `default`).
    Pods: `pods` (PodSpecs) or `pods_path`, else `sim_pods` simulated pods. Settings: `settings`
    or `settings_path`. `address`: join that Ray cluster instead of starting a local one."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    config_path: str | None = None
    config: dict | None = None
    pods_path: str | None = None
    pods: list[Any] | None = None
    # Watch `pods_path` and apply its changes (actors/pod_source_file.py) instead of reading it once.
    watch_pods: bool = False
    sim_pods: int = Field(default=4, ge=1)
    sim_time_scale: float = Field(default=1.0, gt=0)
    sim_pod_overrides: dict = Field(default_factory=dict)
    settings_path: str | None = None
    settings: dict | None = None
    address: str | None = None
    host: str = "127.0.0.1"
    port: int = Field(default=8000, gt=0, lt=65536)
    replicas: int = Field(default=1, ge=1)
    # Actors per scheduling profile (ActorOptions.profile_shards).
    profile_shards: int = Field(default=1, ge=1, le=64)
    proxy_port: int | None = None
    # GIE's Endpoint Picker Protocol (Envoy ext_proc, gRPC) on this port too, served by every replica.
    ext_proc_port: int | None = Field(default=None, gt=0, lt=65536)
    # ActorOptions fields (actors/options.py), e.g. {"metrics_actor_scope": "pod"}
    actor_options: dict | None = None
    app_name: str = "epp"
    # Ray's dashboard on 127.0.0.1 with a Ray we start (`ray list`, `serve status` and the web UI
    # need it); a joined cluster keeps what it has.
    dashboard: bool = False

    @property
    def serve_proxy_port(self) -> int:
        return self.proxy_port or self.port + PROXY_PORT_OFFSET


@dataclass
class EppDeployment:
    pods: list[Any]
    actors: Any
    hub: Any
    url: str
    sim: Any = None
    ext_proc_address: str | None = None  # host:port of the ext_proc gRPC service, when served
    owns_ray: bool = False
    ray_children: list[int] = field(default_factory=list)
    app_name: str = "epp"

    @classmethod
    def start(cls, spec: LaunchSpec | None = None, /, **fields: Any) -> EppDeployment:
        """Validate everything the user gave, check the ports, then start; on any failure stop
        what was started. `start(LaunchSpec(...))`; `start(port=..., ...)` builds the spec."""
        if spec is None:
            spec = LaunchSpec(**fields)
        elif fields:
            raise TypeError("EppDeployment.start takes a LaunchSpec or its fields, not both")
        if spec.address is None or is_loopback_address(spec.address):
            local_ray_env()  # before anything imports ray: its constants read the environment then
        cfg, gw_settings, pod_specs = _validate(spec)
        _check_ports(spec)
        serve_fast_path_env()
        sim = None
        if pod_specs is None:
            sim, pod_specs = _start_sim(spec.sim_pods, spec.sim_time_scale, spec.sim_pod_overrides)
        dep = cls(pods=pod_specs, actors=None, hub=None, url=f"http://{spec.host}:{spec.port}", sim=sim)
        dep.app_name = spec.app_name
        if spec.ext_proc_port is not None:
            dep.ext_proc_address = f"{spec.host}:{spec.ext_proc_port}"
        try:
            dep._start_ray(spec.address, spec.dashboard)
            dep._deploy(spec, cfg, gw_settings)
        except BaseException:
            dep.stop()
            raise
        return dep

    def _start_ray(self, address: str | None, dashboard: bool = False) -> None:
        import ray

        if ray.is_initialized():
            return
        self.owns_ray = address is None
        if address is None:
            # Ray's GCS keeps the last 100,000 tasks' events; each profile call is a task, so a busy
            # gateway grows it to ~400 MiB. Off, it stays near 50 MiB; capped at 10,000, near 100 MiB
            # and creeping, ~90 with the evicted attempts capped too (bench/ray_processes_rss.py).
            os.environ.setdefault("RAY_task_events_report_interval_ms", TASK_EVENTS_REPORT_INTERVAL_MS)
            os.environ.setdefault("RAY_task_events_max_num_task_in_gcs", str(GCS_TASK_EVENTS_KEPT))
            os.environ.setdefault(
                "RAY_task_events_max_dropped_task_attempts_tracked_per_job_in_gcs", str(GCS_TASK_EVENTS_KEPT)
            )
            ray.init(
                # a Ray of our own: without "local", ray.init joins the last `ray start` cluster of
                # this machine (/tmp/ray/ray_current_cluster), or fails on a dead one's leftover file
                address="local",
                num_cpus=os.cpu_count() or 2,
                include_dashboard=dashboard,
                dashboard_host="127.0.0.1",
                log_to_driver=False,
                _node_ip_address="127.0.0.1",
                namespace="ray-epp",
            )
        else:
            ray.init(address=address, namespace="ray-epp", log_to_driver=False)
        self.ray_children = [p.pid for p in psutil.Process().children(recursive=True)]

    def _deploy(self, spec: LaunchSpec, cfg: Any, gw_settings: Any) -> None:
        from ray import serve

        from actors.launcher import start_epp_actors
        from actors.metrics_hub import get_or_create_hub
        from actors.placement import PLACED_MIN_CPUS
        from scheduler import dump_config
        from serve_app.gateway.deployment import Gateway

        options = {**(spec.actor_options or {}), "profile_shards": spec.profile_shards}
        if not self.owns_ray:  # a cluster of other machines: each node must have the package
            from actors.package_check import PackageMissing, require_package_on_every_node
            from ray_epp import __version__

            try:
                require_package_on_every_node(__version__)
            except PackageMissing as err:
                raise LaunchError(str(err)) from None
        decide_in = gw_settings.decide_in  # no profile actor for a profile the replicas decide
        if spec.watch_pods:
            source = {"kind": "file", "path": str(Path(spec.pods_path or "").resolve())}
            self.actors = start_epp_actors(
                dump_config(cfg), [], options=options, pod_sources=[source], decide_in=decide_in
            )
        else:
            self.actors = start_epp_actors(dump_config(cfg), self.pods, options=options, decide_in=decide_in)
        self.hub = get_or_create_hub()
        serve.start(http_options={"host": spec.host, "port": spec.serve_proxy_port})
        # a little CPU, so that Serve's spreading of the replicas over the nodes is not ignored
        # (actors/placement.py PLACED_MIN_CPUS)
        gateway = Gateway.options(num_replicas=spec.replicas, ray_actor_options={"num_cpus": PLACED_MIN_CPUS}).bind(
            dump_config(cfg),
            gw_settings.model_dump(),
            self.actors.datastore,
            self.actors.gateway_shards(),
            self.hub,
            {"host": spec.host, "port": spec.port, "ext_proc_port": spec.ext_proc_port},
            decision_log_for(gw_settings),
        )
        try:
            serve.run(gateway, name=spec.app_name, route_prefix="/")
        except RuntimeError as err:  # Serve's "Deploying application ... failed": say why
            raise LaunchError(f"the gateway did not start: {deploy_failure(spec.app_name) or err}") from None
        self.url = wait_for_gateway(spec.host, spec.port, spec.app_name, spec.replicas, timeout_s=120)

    def pod_source_errors(self) -> dict[str, str]:
        """Pod source id -> the error that keeps its last good pod set (a watched file gone bad)."""
        import ray

        sources = ray.get(self.actors.datastore.sources.remote(), timeout=10)
        return {s["id"]: s["last_error"] for s in sources if s["last_error"]}

    def example_model(self) -> str:
        if self.sim is not None:
            return self.sim.pods[0].config.model
        return "your-model"

    def stop(self) -> None:
        """Serve and Ray when we started Ray, else only our application; the actors, the simulated
        pods; then any Ray process of ours that outlived ray.shutdown()."""
        import ray

        with contextlib.suppress(Exception):
            from ray import serve

            if self.owns_ray:
                serve.shutdown()
            else:  # someone else's Ray (a joined cluster, a notebook's, a test session's): its Serve
                serve.delete(self.app_name)  # and other applications stay; only ours goes
        if self.actors is not None:
            from actors.decision_log import stop_decision_log
            from actors.launcher import stop_epp_actors
            from actors.metrics_hub import stop_hub

            with contextlib.suppress(Exception):
                stop_epp_actors(self.actors)
            stop_hub()
            stop_decision_log()
        if self.owns_ray:
            with contextlib.suppress(Exception):
                ray.shutdown()
            _kill_leftovers(self.ray_children)
        if self.sim is not None:
            with contextlib.suppress(Exception):
                self.sim.stop()


DEFAULT_CONFIG = "default"  # the shipped config of that name (scheduler/config/source.py)


def decision_log_for(settings: Any) -> Any:
    """The decision log actor the gateway replicas share, when the settings record decisions."""
    if settings.decision_record_ratio <= 0:
        return None
    from actors.decision_log import get_or_create_decision_log

    return get_or_create_decision_log()


def _start_sim(n: int, time_scale: float, overrides: dict) -> tuple[Any, list[Any]]:
    from actors.launcher import PodSpec
    from ray_epp.simulator import start_sim_pods_in_thread

    sim = start_sim_pods_in_thread(n, time_scale=time_scale, **overrides)
    specs = [PodSpec(name=p.name, address="127.0.0.1", port=p.port, labels=p.labels) for p in sim.pods]
    return sim, specs


def _validate(spec: LaunchSpec) -> tuple[Any, Any, list[Any] | None]:
    from actors.launcher import load_pods_file
    from actors.options import as_options
    from scheduler import ConfigError, load_config, load_config_file
    from serve_app.gateway.settings import GatewaySettings, load_settings_file

    try:
        if spec.config is not None:
            cfg = load_config(spec.config)
        else:
            cfg = load_config_file(spec.config_path or DEFAULT_CONFIG)
    except ConfigError as err:
        raise LaunchError(str(err)) from None
    if spec.watch_pods and not spec.pods_path:
        raise LaunchError("watching the pods file needs a pods file (--pods)")
    try:
        if spec.settings_path:
            gw_settings = load_settings_file(spec.settings_path)
        else:
            gw_settings = GatewaySettings.model_validate(spec.settings or {})
        if spec.pods is not None:
            pod_specs = list(spec.pods)
        else:
            pod_specs = load_pods_file(spec.pods_path) if spec.pods_path else None
        actor_options = as_options(spec.actor_options)
        if gw_settings.decide_in_replica:
            from serve_app.gateway.local_runner import check_in_replica

            check_in_replica(cfg, actor_options.profile_shards)
    except ValueError as err:
        raise LaunchError(str(err)) from None
    return cfg, gw_settings, pod_specs


def _check_ports(spec: LaunchSpec) -> None:
    """The gateway port and Serve's proxy port must be free (a connection of an earlier run in
    TIME_WAIT is fine): come up on the port asked for, or say who holds it."""
    from serve_app.gateway.ingress import PortInUse, check_port_free

    checks = [("gateway", spec.port)]
    if spec.ext_proc_port is not None:
        if spec.ext_proc_port in (spec.port, spec.serve_proxy_port):
            raise LaunchError(f"--ext-proc-port {spec.ext_proc_port} is also the HTTP or Serve proxy port")
        checks.append(("ext_proc", spec.ext_proc_port))
    # A joined cluster's Serve, or the Ray this process already runs (tests, notebooks), may run its
    # proxy there already: serve.start keeps it.
    ray_module = sys.modules.get("ray")
    attached = ray_module is not None and ray_module.is_initialized()
    if spec.address is None and not attached:
        checks.append(("Serve proxy", spec.serve_proxy_port))
    for what, port in checks:
        deadline = time.monotonic() + PORT_FREE_WAIT_S
        while True:
            try:
                check_port_free(spec.host, port)
                break
            except PortInUse as err:
                if time.monotonic() > deadline:
                    flag = {"gateway": "--port", "ext_proc": "--ext-proc-port"}.get(what, "--proxy-port")
                    todo = "wait" if err.time_wait else "stop it"
                    raise LaunchError(f"the {what} {err}; {todo} or choose another {flag}") from None
                time.sleep(0.25)
            except OSError as err:
                raise LaunchError(f"can not bind the {what} port {spec.host}:{port}: {err.strerror}") from None


def deploy_failure(app_name: str) -> str:
    """What stopped the application's replicas, as Serve recorded it: the last line of the
    exception a replica's constructor raised (e.g. the port taken), else Serve's message."""
    from ray import serve

    with contextlib.suppress(Exception):
        app = serve.status().applications.get(app_name)
        for deployment in app.deployments.values() if app is not None else ():
            if deployment.status == "DEPLOY_FAILED" and deployment.message:
                lines = [line.strip() for line in deployment.message.splitlines() if line.strip()]
                return re.sub(r"^[A-Za-z_][\w.]*: ", "", lines[-1])  # without the exception's class path
        if app is not None and app.message:
            return app.message
    return ""


def wait_for_gateway(host: str, port: int, app_name: str, replicas: int, timeout_s: float) -> str:
    """The gateway's URL once Serve runs every replica (each one joins the port's group before
    its constructor returns) and the port answers /ready."""
    import json
    import urllib.error
    import urllib.request

    from ray import serve

    from serve_app.gateway.deployment import GATEWAY_SERVICE

    url = f"http://{host}:{port}"
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        try:
            app = serve.status().applications.get(app_name)
            running = 0
            if app is not None:
                running = sum(d.replica_states.get("RUNNING", 0) for d in app.deployments.values())
            if running < replicas:
                last = f"{running} of {replicas} replicas running"
                time.sleep(0.25)
                continue
            with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                if json.loads(resp.read()).get("service") != GATEWAY_SERVICE:
                    raise LaunchError(f"{url} answers, but it is not a Ray EPP gateway")
            with urllib.request.urlopen(f"{url}/ready", timeout=5) as resp:
                if resp.status == 200:
                    return url
        except urllib.error.HTTPError as err:
            last = f"{url}/ready answered {err.code}"
        except (OSError, ValueError) as err:
            last = f"{url}: {err}"
        time.sleep(0.25)
    raise LaunchError(f"the gateway did not become ready on {url} in {timeout_s:.0f} s ({last})")


def _kill_leftovers(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            proc.terminate()
    gone_deadline = time.monotonic() + 3
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).wait(max(0.0, gone_deadline - time.monotonic()))
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).kill()
