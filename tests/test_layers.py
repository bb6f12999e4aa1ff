"""The layer rules of docs/DESIGN.md ("Layers and folders"), checked on every import in the code,
including imports inside functions."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROJECT = {"scheduler", "actors", "serve_app", "simulator", "kvevents", "bench"}
# The command line: the one place in serve_app/ that wires every layer, simulated pods included.
COMPOSITION_ROOT = {"serve_app/cli.py", "serve_app/up.py", "serve_app/launch.py"}

MAY_IMPORT = {
    "kvevents": set(),
    "scheduler": {"kvevents"},
    "simulator": {"kvevents"},
    "actors": {"scheduler", "kvevents", "ray"},
    "serve_app": {"actors", "scheduler", "kvevents", "ray"},
    "bench": PROJECT | {"ray"},
}


def imported_packages(path: Path) -> set[str]:
    """The top-level packages a module imports (absolute imports; relative ones stay in the package)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found & (PROJECT | {"ray"})


def allowed(rel: str) -> set[str]:
    package = rel.split("/")[0]
    extra = {"simulator", "bench"} if rel in COMPOSITION_ROOT else set()
    return MAY_IMPORT[package] | extra | {package}


@pytest.mark.parametrize("package", sorted(MAY_IMPORT))
def test_every_module_imports_only_what_its_layer_may(package):
    wrong = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        extra = imported_packages(path) - allowed(rel)
        if extra:
            wrong[rel] = sorted(extra)
    assert wrong == {}


def test_the_rules_catch_a_forbidden_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    import ray\n    from serve_app import up\n")
    assert imported_packages(bad) - allowed("scheduler/bad.py") == {"ray", "serve_app"}
    assert imported_packages(bad) - allowed("actors/bad.py") == {"serve_app"}
