"""Starting a real deployment (EppDeployment: Ray actors + the Serve gateway) in front of a
module's simulated pods, the way every gateway test module does."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import GATEWAY_TEST_PORT


def pod_specs(sim) -> list:
    """The pods file entries of a simulator cluster's pods."""
    from actors.launcher import PodSpec

    return [PodSpec(name=p.name, address="127.0.0.1", port=p.port, labels=p.labels) for p in sim.pods]


def start_deployment(sim, config: str = "default", **spec: Any):
    """A started EppDeployment; `config` is a path or an EndpointPickerConfig's YAML text, and
    `spec` any other LaunchSpec field (settings, replicas, port: the test port by default)."""
    from serve_app.cli.launch import EppDeployment, LaunchSpec

    if "\n" in config:  # YAML text: LaunchSpec reads a file
        path = Path(tempfile.mkdtemp(prefix="epp-test-config-")) / "config.yaml"
        path.write_text(config)
        config = str(path)
    spec.setdefault("port", GATEWAY_TEST_PORT)
    return EppDeployment.start(LaunchSpec(config_path=config, pods=pod_specs(sim), **spec))


def sim_pods(n_or_configs, seed: int, **pod_overrides: Any) -> Iterator[Any]:
    """A module's simulated pods for a fixture to yield (`yield from sim_pods(3, seed=7)`): n pods
    with `make_pod_configs` overrides, or the given PodConfigs; stopped when the module ends."""
    from ray_epp.simulator import make_pod_configs, start_sim_pods_in_thread

    configs = make_pod_configs(n_or_configs, **pod_overrides) if isinstance(n_or_configs, int) else n_or_configs
    cluster = start_sim_pods_in_thread(configs, time_scale=1.0, seed=seed)
    try:
        yield cluster
    finally:
        cluster.stop()


def wait_until(predicate: Callable[[], Any], timeout_s: float = 10.0, every_s: float = 0.1) -> Any:
    """`predicate()`'s first true value, polled; AssertionError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError("condition not reached in time")


def replicas(url: str, want: int, tries: int = 400) -> dict[str, int]:
    """The replicas behind the port (actor name -> pid), seen over fresh connections (the kernel
    spreads them over the port's sockets)."""
    seen: dict[str, int] = {}
    for _ in range(tries):
        with httpx.Client(timeout=5) as c:  # a new connection each time
            health = c.get(f"{url}/health").json()
        seen[health["replica"]] = health["pid"]
        if len(seen) >= want:
            break
    return seen


def in_flight(gateway) -> int:
    """Requests the profile actors' plugins were told of (PreRequest) and not yet told the end of
    (ResponseComplete): what their in-flight ledgers hold."""
    import ray

    infos = ray.get([a.info.remote() for a in gateway.actors.all_profile_actors()], timeout=30)
    return sum(i["events"].get("pre_request", 0) - i["events"].get("response_complete", 0) for i in infos)
