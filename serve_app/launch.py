"""Bring up the whole product in one call: Ray, simulated pods (optional), the actors, the
gateway on Serve — and take it all down again, leaving no Ray process behind.

Used by `epp up`, the tests and the benchmarks."""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

# Serve's proxy (it balances over replicas but adds ~12 ms) listens here; clients use the replicas'
# direct-ingress ports, which start at the gateway port.
PROXY_PORT_OFFSET = 88


def serve_fast_path_env(port: int, replicas: int) -> None:
    """Ray Serve's fast path (DESIGN.md: +1 ms instead of +13 ms): throughput-optimised Serve with
    direct ingress, each gateway replica serving HTTP itself on port, port+1, ... Must be set
    before Ray starts, so Serve's controller and replicas inherit it."""
    os.environ.setdefault("RAY_SERVE_THROUGHPUT_OPTIMIZED", "1")
    os.environ.setdefault("RAY_SERVE_ENABLE_DIRECT_INGRESS", "1")
    os.environ["RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT"] = str(port)
    os.environ["RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT"] = str(port + max(replicas, 1) + 8)
    # A released port is kept out of use for 150 s by default (for HAProxy, which we do not use);
    # without this a restarted gateway would move to another port.
    os.environ.setdefault("RAY_SERVE_PORT_QUARANTINE_S", "0")
    # Direct ingress waits this long for a replica to drain before it stops (default 30 s).
    os.environ.setdefault("RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S", "1")
    os.environ.setdefault("RAY_SERVE_DIRECT_INGRESS_MIN_GRPC_PORT", str(port + 200))
    os.environ.setdefault("RAY_SERVE_DIRECT_INGRESS_MAX_GRPC_PORT", str(port + 300))


class LaunchError(RuntimeError):
    """Something the user gave us (config, pods file, settings) or the environment is wrong."""


@dataclass
class EppDeployment:
    pods: list[Any]
    actors: Any
    hub: Any
    url: str
    sim: Any = None
    urls: list[str] = field(default_factory=list)  # one per replica (direct ingress)
    owns_ray: bool = False
    ray_children: list[int] = field(default_factory=list)

    @classmethod
    def start(
        cls,
        config_path: str | None = None,
        config: dict | None = None,
        pods_path: str | None = None,
        pods: list[Any] | None = None,
        sim_pods: int = 4,
        sim_time_scale: float = 1.0,
        sim_pod_overrides: dict | None = None,
        settings_path: str | None = None,
        settings: dict | None = None,
        address: str | None = None,
        host: str = "127.0.0.1",
        port: int = 8000,
        replicas: int = 1,
        proxy_port: int | None = None,
        app_name: str = "epp",
    ) -> EppDeployment:
        serve_fast_path_env(port, replicas)
        import ray
        from ray import serve

        from actors.launcher import load_pods_file, start_epp_actors
        from actors.metrics_hub import get_or_create_hub
        from scheduler import ConfigError, dump_config, load_config, load_config_file
        from serve_app.gateway import Gateway
        from serve_app.settings import GatewaySettings, load_settings_file

        # Validate everything the user gave before starting anything.
        try:
            cfg = load_config(config) if config is not None else load_config_file(config_path or DEFAULT_CONFIG)
        except ConfigError as err:
            raise LaunchError(str(err)) from None
        try:
            gw_settings = (
                load_settings_file(settings_path) if settings_path else GatewaySettings.model_validate(settings or {})
            )
            pod_specs = list(pods) if pods is not None else (load_pods_file(pods_path) if pods_path else None)
        except ValueError as err:
            raise LaunchError(str(err)) from None

        sim = None
        if pod_specs is None:
            sim, pod_specs = _start_sim(sim_pods, sim_time_scale, sim_pod_overrides or {})
        dep = cls(pods=pod_specs, actors=None, hub=None, url=f"http://{host}:{port}", sim=sim)
        try:
            if not ray.is_initialized():
                dep.owns_ray = address is None
                if address is None:
                    ray.init(
                        num_cpus=os.cpu_count() or 2,
                        include_dashboard=False,
                        log_to_driver=False,
                        _node_ip_address="127.0.0.1",
                        namespace="ray-epp",
                    )
                else:
                    ray.init(address=address, namespace="ray-epp", log_to_driver=False)
                dep.ray_children = [p.pid for p in psutil.Process().children(recursive=True)]
            dep.actors = start_epp_actors(dump_config(cfg), pod_specs)
            dep.hub = get_or_create_hub()
            serve.start(http_options={"host": host, "port": proxy_port or port + PROXY_PORT_OFFSET})
            gateway = Gateway.options(num_replicas=replicas).bind(
                dump_config(cfg), gw_settings.model_dump(), dep.actors.datastore, dep.actors.profiles, dep.hub
            )
            serve.run(gateway, name=app_name, route_prefix="/")
            dep.urls = _find_replicas(host, port, replicas, timeout_s=120)
            dep.url = dep.urls[0]
        except BaseException:
            dep.stop()
            raise
        return dep

    def example_model(self) -> str:
        if self.sim is not None:
            return self.sim.pods[0].config.model
        return "your-model"

    def stop(self) -> None:
        """Serve, the actors, Ray (when we started it), the simulated pods; then any Ray process
        of ours that outlived ray.shutdown()."""
        import ray

        with contextlib.suppress(Exception):
            from ray import serve

            serve.shutdown()
        if self.actors is not None:
            from actors.launcher import stop_epp_actors
            from actors.metrics_hub import stop_hub

            with contextlib.suppress(Exception):
                stop_epp_actors(self.actors)
            stop_hub()
        if self.owns_ray:
            with contextlib.suppress(Exception):
                ray.shutdown()
            _kill_leftovers(self.ray_children)
        if self.sim is not None:
            with contextlib.suppress(Exception):
                self.sim.stop()


DEFAULT_CONFIG = str(Path(__file__).resolve().parents[1] / "configs" / "default.yaml")


def _start_sim(n: int, time_scale: float, overrides: dict) -> tuple[Any, list[Any]]:
    from actors.launcher import PodSpec
    from simulator import start_sim_pods_in_thread

    sim = start_sim_pods_in_thread(n, time_scale=time_scale, **overrides)
    specs = [PodSpec(name=p.name, address="127.0.0.1", port=p.port, labels=p.labels) for p in sim.pods]
    return sim, specs


def _find_replicas(host: str, port: int, replicas: int, timeout_s: float) -> list[str]:
    """The gateway replicas' direct-ingress URLs, once every one is ready. Serve gives replicas the
    first free ports from `port` up; a port still held by a process that is going away moves a
    replica to the next one, so look rather than assume."""
    import json
    import urllib.error
    import urllib.request

    from serve_app.gateway import GATEWAY_SERVICE

    deadline = time.monotonic() + timeout_s
    candidates = range(port, port + max(replicas, 1) + 8)
    last = ""
    while time.monotonic() < deadline:
        found = []
        for p in candidates:
            url = f"http://{host}:{p}"
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                    if json.loads(resp.read()).get("service") != GATEWAY_SERVICE:
                        continue
                with urllib.request.urlopen(f"{url}/ready", timeout=5) as resp:
                    if resp.status == 200:
                        found.append(url)
            except urllib.error.HTTPError as err:
                last = f"{url}/ready answered {err.code}"
            except (OSError, ValueError) as err:
                last = f"{url}: {err}"
        if len(found) >= replicas:
            return found
        time.sleep(0.25)
    raise LaunchError(
        f"the gateway did not become ready on ports {port}-{candidates[-1]} in {timeout_s:.0f} s ({last})"
    )


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
