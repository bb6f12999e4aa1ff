"""Starting Ray nodes on a loaded machine. A raylet waits at most 15-30 s (not configurable) for
its dashboard agent to write the agent's ports into the session directory, even when the ports
were given, and exits then; on this shared 2-core machine the agent can take a minute to import.
Writing those files first (the ports given, for a node id chosen beforehand) lets the raylet go
on; the agent writes the same ports when it is up."""

from __future__ import annotations

import os

AGENT_PORTS = ("metrics_agent_port", "metrics_export_port", "dashboard_agent_listen_port", "runtime_env_agent_port")


def write_agent_port_files(session_dir: str, node_id: str, ports: dict[str, int]) -> None:
    """`ports`: a port for each name in AGENT_PORTS."""
    os.makedirs(session_dir, exist_ok=True)
    for name in AGENT_PORTS:
        with open(os.path.join(session_dir, f"{name}_{node_id}"), "w") as f:
            f.write(str(ports[name]))
