"""A local Ray for the benchmarks that start their own, like the tests' (2 CPUs, 127.0.0.1), which a
busy shared machine does not abort at start-up."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import ray


def start_local_ray(attempts: int = 10) -> None:
    """A local Ray like the tests' (2 CPUs, 127.0.0.1), started so that a busy machine does not
    abort it (`give_agent_ports`), and tried again if it fails all the same."""
    undo = give_agent_ports()
    try:
        _init_with_retries(attempts)
    finally:
        undo()


def give_agent_ports() -> Callable[[], None]:
    """Make this process's next Ray start give its dashboard agent free ports up front; returns
    the undo.

    The raylet waits at most 15 s for the dashboard agent to write the ports it chose, then
    aborts ("timed out during startup"); on a busy 2-core machine the agent's start alone takes
    longer, and with another Ray here it also spends ~8 s retrying its default port 52365. Ports
    given up front are not waited for, and `ray.init` cannot give them: so this does."""
    import socket

    import ray._private.parameter as parameter

    ports = []
    for _ in range(3):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            ports.append(sock.getsockname()[1])
    original = parameter.RayParams.__init__

    def with_agent_ports(self: Any, *args: Any, **kwargs: Any) -> None:
        keys = ("dashboard_agent_listen_port", "metrics_agent_port", "metrics_export_port")
        for key, port in zip(keys, ports, strict=True):
            if kwargs.get(key) is None:
                kwargs[key] = port
        original(self, *args, **kwargs)

    parameter.RayParams.__init__ = with_agent_ports  # type: ignore[method-assign]

    def undo() -> None:
        parameter.RayParams.__init__ = original  # type: ignore[method-assign]

    return undo


def _init_with_retries(attempts: int) -> None:
    for attempt in range(1, attempts + 1):
        try:
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
            return
        except Exception as err:  # "The current node timed out during startup"
            if attempt == attempts:
                raise
            print(f"ray.init failed ({err}); retrying", flush=True)
            time.sleep(5)
