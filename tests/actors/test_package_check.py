"""Every node is asked, before anything is placed, which Ray EPP its workers import
(actors/package_check.py): on the test Ray, with the real probe task."""

from __future__ import annotations

import pytest

from actors.package_check import (
    PACKAGES,
    NodeReport,
    PackageMissing,
    probe_nodes,
    problems,
    require_package_on_every_node,
)
from ray_epp import __version__


def test_every_node_of_the_test_ray_has_this_version(ray_session):
    reports = probe_nodes()
    assert len(reports) == len([n for n in ray_session.nodes() if n["Alive"]]) >= 1
    assert all(r.version == __version__ and r.missing == () for r in reports)
    require_package_on_every_node(__version__)  # raises nothing


def test_a_node_whose_workers_can_not_import_a_package_is_named(ray_session):
    """`no_such_package_here` stands for a package the node lacks: the probe looks it up there."""
    with pytest.raises(PackageMissing) as info:
        require_package_on_every_node(__version__, packages=(*PACKAGES, "no_such_package_here"))
    message = str(info.value)
    assert "has no ray-epp package (can not import no_such_package_here)" in message
    assert "deploy/Dockerfile" in message and f"ray-epp=={__version__}" in message


def test_another_version_on_a_node_is_named(ray_session):
    with pytest.raises(PackageMissing, match=f"has ray-epp {__version__}, this driver 9.9.9"):
        require_package_on_every_node("9.9.9")


@pytest.mark.parametrize(
    ("report", "expected"),
    [
        (NodeReport("a" * 56, "10.0.0.1", "0.2.0", ()), []),
        (NodeReport("a" * 56, "10.0.0.1", None, ("scheduler", "actors")), ["has no ray-epp package"]),
        (NodeReport("a" * 56, "10.0.0.1", "0.1.0", ()), ["has ray-epp 0.1.0, this driver 0.2.0"]),
        # a source tree on the path without the distribution's metadata: importable, so it runs
        (NodeReport("a" * 56, "10.0.0.1", None, ()), []),
    ],
)
def test_problems_per_node(report, expected):
    lines = problems([report], "0.2.0")
    assert len(lines) == len(expected)
    for line, fragment in zip(lines, expected, strict=True):
        assert fragment in line and "10.0.0.1" in line
