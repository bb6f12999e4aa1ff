"""Starting a real deployment (EppDeployment: Ray actors + the Serve gateway) in front of a
module's simulated pods, the way every gateway test module does."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from tests.conftest import GATEWAY_TEST_PORT


def pod_specs(sim) -> list:
    """The pods file entries of a simulator cluster's pods."""
    from actors.launcher import PodSpec

    return [PodSpec(name=p.name, address="127.0.0.1", port=p.port, labels=p.labels) for p in sim.pods]


def start_deployment(sim, config: str = "default", **spec: Any):
    """A started EppDeployment; `config` is a path or an EndpointPickerConfig's YAML text, and
    `spec` any other LaunchSpec field (settings, replicas, port: the test port by default)."""
    from serve_app.launch import EppDeployment, LaunchSpec

    if "\n" in config:  # YAML text: LaunchSpec reads a file
        path = Path(tempfile.mkdtemp(prefix="epp-test-config-")) / "config.yaml"
        path.write_text(config)
        config = str(path)
    spec.setdefault("port", GATEWAY_TEST_PORT)
    return EppDeployment.start(LaunchSpec(config_path=config, pods=pod_specs(sim), **spec))
