"""Every node of the cluster has Ray EPP installed, at the driver's version: checked before any
actor or replica is placed, so that a node without the package is one clear error naming it, not
a `ModuleNotFoundError` deep in a replica's log once Serve has placed something there.

The probe runs as one task per alive node, pinned to it. It is defined inside `probe_nodes`, so
Ray sends it by value and a node without the package can still run it (a module-level function
would be imported there by name, and fail the same opaque way the actors would)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

DISTRIBUTION = "ray-epp"
PACKAGES = ("scheduler", "actors", "serve_app", "ray_epp")
PROBE_TIMEOUT_S = 120.0  # a node's first task may start a worker (and a runtime_env) first
INSTALL_HINT = (
    "every Ray node needs the ray-epp package at the driver's version: an image built from "
    "deploy/Dockerfile, or runtime_env={'pip': ['ray-epp==VERSION']} (docs/INSTALL.md)"
)


class PackageMissing(RuntimeError):
    """A node lacks Ray EPP, or runs another version of it."""


@dataclass(frozen=True, slots=True)
class NodeReport:
    node_id: str
    address: str
    version: str | None  # the ray-epp distribution's version there; None: not installed
    missing: tuple[str, ...]  # of PACKAGES, the ones a worker there can not find


def probe_nodes(
    runtime_env: dict[str, Any] | None = None,
    timeout_s: float = PROBE_TIMEOUT_S,
    packages: tuple[str, ...] = PACKAGES,
) -> list[NodeReport]:
    """What each alive node's workers find of Ray EPP (`packages`: the import names to look for)."""

    def probe() -> tuple[str | None, list[str]]:
        import importlib.metadata
        import importlib.util

        try:
            version = importlib.metadata.version(DISTRIBUTION)
        except importlib.metadata.PackageNotFoundError:
            version = None
        return version, [p for p in packages if importlib.util.find_spec(p) is None]

    remote = ray.remote(num_cpus=0, max_retries=0)(probe)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    refs = [
        remote.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False), runtime_env=runtime_env
        ).remote()
        for n in nodes
    ]
    answers = ray.get(refs, timeout=timeout_s)
    return [
        NodeReport(n["NodeID"], n.get("NodeManagerAddress", "?"), version, tuple(missing))
        for n, (version, missing) in zip(nodes, answers, strict=True)
    ]


def problems(reports: list[NodeReport], expected_version: str) -> list[str]:
    """One line per node that lacks the package or runs another version of it."""
    out = []
    for r in reports:
        where = f"Ray node {r.node_id[:12]}... ({r.address})"
        if r.missing:
            out.append(f"{where} has no {DISTRIBUTION} package (can not import {', '.join(r.missing)})")
        elif r.version is not None and r.version != expected_version:
            out.append(f"{where} has {DISTRIBUTION} {r.version}, this driver {expected_version}")
    return out


def require_package_on_every_node(
    expected_version: str, runtime_env: dict[str, Any] | None = None, packages: tuple[str, ...] = PACKAGES
) -> None:
    """Raise PackageMissing naming every node that lacks Ray EPP or runs another version."""
    lines = problems(probe_nodes(runtime_env, packages=packages), expected_version)
    if lines:
        hint = INSTALL_HINT.replace("VERSION", expected_version)
        raise PackageMissing("; ".join(lines) + f". {hint}")
