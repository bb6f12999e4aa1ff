"""How an operator's tools reach the Ray cluster `epp up` started: `ray status`, `ray list actors`,
`serve status`, the dashboard and a Python driver (`ray.init()`).

Three settings are needed, and `epp up` / `epp env` print them as one line to paste:
* `RAY_ADDRESS`: the GCS on 127.0.0.1 (`address="auto"` alone finds no cluster file to read);
* `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`: without it Ray rewrites 127.0.0.1 to the machine's
  address (services.resolve_ip_for_localhost), where this cluster does not listen, and the client
  waits there (launch.local_ray_env sets it for `epp up` itself);
* `RAY_AUTH_MODE=token`: Ray turns token authentication on for a new local cluster, but a client
  given an explicit address does not turn it on by itself (the token is in ~/.ray/auth_token);
and `RAY_DASHBOARD_ADDRESS` for `serve status` (its default is localhost:8265, which another
cluster's dashboard may hold).

`epp up` writes them to a file per gateway port while it runs (`epp env` reads it) and removes it
when it stops."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

ACCESS_DIR = Path(tempfile.gettempdir()) / f"ray-epp-up-{os.getuid()}"


@dataclass(frozen=True, slots=True)
class ClusterAccess:
    gcs_address: str  # host:port
    dashboard_url: str | None  # http://host:port, None without the dashboard
    pid: int  # the `epp up` process

    def env(self) -> dict[str, str]:
        out = {
            "RAY_ADDRESS": self.gcs_address,
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
            "RAY_AUTH_MODE": "token",
        }
        if self.dashboard_url:
            out["RAY_DASHBOARD_ADDRESS"] = self.dashboard_url
        return out

    def shell_line(self) -> str:
        return "export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env().items())


def access_file(port: int) -> Path:
    return ACCESS_DIR / f"{port}.json"


def current_access(pid: int | None = None) -> ClusterAccess:
    """The running Ray of this process (a driver connected to it)."""
    import ray

    ctx = ray.get_runtime_context()
    dashboard = ray._private.worker.get_dashboard_url() or None  # "" without the dashboard
    if dashboard and not dashboard.startswith("http"):
        dashboard = f"http://{dashboard}"
    return ClusterAccess(ctx.gcs_address, dashboard, os.getpid() if pid is None else pid)


def write_access(port: int, access: ClusterAccess) -> Path:
    ACCESS_DIR.mkdir(mode=0o700, exist_ok=True)
    path = access_file(port)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(access)))
    tmp.replace(path)
    return path


def remove_access(port: int, pid: int) -> None:
    """Remove the port's file if it is this process's (a later `epp up` may have replaced it)."""
    with contextlib.suppress(OSError, ValueError, TypeError):
        if read_access_file(access_file(port)).pid == pid:
            access_file(port).unlink()


def read_access_file(path: Path) -> ClusterAccess:
    return ClusterAccess(**json.loads(path.read_text()))


def running_accesses() -> dict[int, ClusterAccess]:
    """Gateway port -> access, for each `epp up` of this user whose process is still alive."""
    out: dict[int, ClusterAccess] = {}
    for path in sorted(ACCESS_DIR.glob("*.json")) if ACCESS_DIR.is_dir() else []:
        try:
            access = read_access_file(path)
            os.kill(access.pid, 0)  # alive (a crashed `epp up` leaves its file behind)
        except (OSError, ValueError, TypeError):
            continue
        out[int(path.stem)] = access
    return out
