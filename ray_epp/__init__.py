"""Ray EPP's own package: its version, and what ships beside the router's layers (`scheduler`,
`actors`, `serve_app`): the named configs (`ray_epp.configs`), the examples (`ray_epp.examples`),
simulated vLLM pods (`ray_epp.simulator`) and vLLM's KV-event wire format (`ray_epp.kvevents`).

Importing it imports nothing else."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

DISTRIBUTION = "ray-epp"

try:
    __version__ = version(DISTRIBUTION)
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"
