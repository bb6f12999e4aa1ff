"""Starting a real deployment (EppDeployment: Ray actors + the Serve gateway) in front of a
module's simulated pods, the way every gateway test module does."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import GATEWAY_TEST_PORT


def pod_specs(sim) -> list:
    """The pods file entries of a simulator cluster's pods, with the KV-event addresses of those
    that publish them (as `epp sim` lists them)."""
    from actors.launcher import PodSpec

    return [PodSpec(**p._pod.info()) for p in sim.pods]


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


@dataclass(frozen=True)
class E2ESetup:
    """What an e2e module runs against: its simulated pods and the deployment in front of them.
    A module declares one as `E2E_SETUP` and gets them from the `sim` and `gateway` fixtures
    (tests/serve_app/conftest.py); modules that declare equal setups run one after the other
    (tests/conftest.py) and share one deployment, started once."""

    pods: int | tuple  # n pods made with `pod_overrides`, or the PodConfigs
    seed: int
    pod_overrides: dict = field(default_factory=dict)
    time_scale: float = 1.0
    config: str = "default"  # a shipped config's name, a path or YAML text
    spec: dict = field(default_factory=dict)  # other LaunchSpec fields: settings, replicas, ext_proc_port...


class SharedE2E:
    """The one e2e setup that runs (the test port takes one deployment at a time): started when a
    module asks for another, stopped when the module after it wants a different one."""

    def __init__(self) -> None:
        self.setup: E2ESetup | None = None
        self.sim: Any = None
        self.deployment: Any = None

    def start(self, setup: E2ESetup) -> SharedE2E:
        from ray_epp.simulator import make_pod_configs, start_sim_pods_in_thread

        if setup == self.setup:
            return self
        self.stop()
        configs = make_pod_configs(setup.pods, **setup.pod_overrides) if isinstance(setup.pods, int) else setup.pods
        self.sim = start_sim_pods_in_thread(list(configs), time_scale=setup.time_scale, seed=setup.seed)
        self.deployment = start_deployment(self.sim, setup.config, **setup.spec)
        self.setup = setup
        return self

    def stop(self) -> None:
        deployment, sim = self.deployment, self.sim
        self.setup = self.deployment = self.sim = None
        try:
            if deployment is not None:
                deployment.stop()
        finally:
            if sim is not None:
                sim.stop()


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


def _traced_pd() -> E2ESetup:
    from ray_epp.simulator import PodConfig

    pods = (PodConfig(name="prefill-0", role="prefill"), PodConfig(name="decode-0", role="decode"))
    settings = {"tracing_sample_ratio": 1.0, "tracing_exporter": "none"}
    return E2ESetup(pods=pods, seed=5, config="pd", spec={"settings": settings})


# The P/D config on one prefill and one decode pod, the Serve gateway tracing every request (no
# collector): the tracing tests of both doors (test_tracing.py, extproc/test_extproc_tracing.py).
TRACED_PD = _traced_pd()


def _pd_debug() -> E2ESetup:
    from ray_epp.simulator import PodConfig, TimingConfig

    # Prefill 10x slower than the default engine (0.25 s for a 900-token prompt), so that a prefill
    # can be caught running.
    slow_prefill = TimingConfig(prefill_per_token_s=3.0e-4)
    pods = tuple(PodConfig(name=f"prefill-{i}", role="prefill", timing=slow_prefill) for i in range(2))
    pods += tuple(PodConfig(name=f"decode-{i}", role="decode") for i in range(2))
    # The trace is how the tests see the P/D decision: open to any x-epp-debug value.
    spec = {"settings": {"debug_trace": True}, "ext_proc_port": GATEWAY_TEST_PORT + 3}
    return E2ESetup(pods=pods, seed=3, config="pd", spec=spec)


# The P/D config on two prefill and two decode pods, both doors: test_pd_e2e.py and
# extproc/test_extproc_pd.py.
PD_DEBUG = _pd_debug()


# The default config behind two gateway replicas on one port, both doors, every decision recorded:
# test_decision_record.py, then test_gateway_failover.py's kill (it waits for the replacement), then
# extproc/test_extproc_failover.py (it kills a replica), then the gateway failover's graceful stop.
# Each pod takes 16 requests at once (the failovers' load).
TWO_REPLICAS = E2ESetup(
    pods=2,
    seed=23,
    pod_overrides={"max_num_seqs": 16},
    spec={
        "replicas": 2,
        "ext_proc_port": GATEWAY_TEST_PORT + 3,
        "settings": {
            "admin_token": "decisions-admin-token-0123",
            "decision_record_ratio": 1.0,
            "decision_record_size": 8,
        },
    },
)


# The default config on three pods of 4 sequences each, both doors, two objectives, a body limit,
# the admin routes: test_gateway_e2e.py, extproc/test_extproc_e2e.py and test_api_routes.py (its
# test that removes a pod runs after the others' tests, theirs that stop every pod last).
BOTH_DOORS = E2ESetup(
    pods=3,
    seed=7,
    pod_overrides={"max_num_seqs": 4},
    spec={
        "ext_proc_port": GATEWAY_TEST_PORT + 3,
        "settings": {
            "max_body_bytes": 200_000,
            "objectives": {"batch": -1, "chat": 1},
            "debug_token": "operator-secret",
            "admin_token": "admin-secret-for-api-routes-0123",
            "pick_api": True,
            "profile_call_timeout_s": 5.0,
        },
    },
)
