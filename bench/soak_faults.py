"""The soak's faults (bench/soak.py), one at a time and in turn: what each one breaks (a pod process,
an actor, a gateway replica, a hung pod, a KV-event publisher, a Ray node: bench/soak_nodes.py) and
how the soak tells the part is back, so every fault's cost and recovery time can be reported."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bench.soak import SoakConfig

FAULTS = ("pod", "datastore", "metrics-actor", "profile-actor", "gateway-replica", "hung-pod", "kv-publisher", "node")


@dataclass
class Fault:
    kind: str
    t: float
    detail: str = ""
    back_t: float | None = None  # pods: when the process was started again
    recovered_s: float | None = None  # from the fault until the part serves again
    replicas_lost: int = 0  # gateway replicas that died with the fault (their connections break)


# What a client sees when the gateway replica holding its connection dies. Such failures within
# HELD_S of a fault that took a replica are counted apart: no server can save a connection held by
# a process that is gone (the kernel hands new connections to the dead replica's socket until the
# process exits, so a few sent just after the fault break the same way).
CONNECTION_BROKEN = frozenset({"ServerDisconnectedError", "ClientPayloadError", "ClientOSError"})
HELD_S = 10.0


def held_by_lost_replica(fault: Fault, error: str, ended_at: float) -> bool:
    return fault.replicas_lost > 0 and error in CONNECTION_BROKEN and ended_at - fault.t <= HELD_S


class SoakFaults:
    """The fault half of `Soak` (its base): reads the soak's config, deployment, pods and clock,
    and appends to its `faults`."""

    cfg: SoakConfig
    dep: Any  # the EppDeployment
    t0: float
    pod_procs: dict[str, subprocess.Popen]
    faults: list[Fault]
    cluster: Any  # bench/soak_nodes.SoakCluster with --nodes, else None
    start_pod: Callable[[str], None]

    def inject(self, kind: str, k: int) -> Fault:
        """Inject one fault, then wait (in this thread, up to 120 s) until the part is back:
        `recovered_s` is from the fault to then (None: not back in time)."""
        import ray

        fault = Fault(kind, time.monotonic() - self.t0)
        actors = self.dep.actors
        back: Any = None  # () -> bool: the part is back
        if kind == "pod":
            name = sorted(self.pod_procs)[k % len(self.pod_procs)]
            proc = self.pod_procs[name]
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            fault.detail = f"{name} (pid {proc.pid}) SIGKILLed, started again after {self.cfg.pod_down_s:g} s"
            time.sleep(self.cfg.pod_down_s)
            self.start_pod(name)
            fault.back_t = time.monotonic() - self.t0

            def back() -> bool:  # routable again: healthy, fresh metrics
                _, endpoints = ray.get(actors.datastore.snapshot.remote(), timeout=10)
                return name in {e.name for e in endpoints}
        elif kind == "hung-pod":
            name = sorted(self.pod_procs)[k % len(self.pod_procs)]
            proc = self.pod_procs[name]
            proc.send_signal(signal.SIGSTOP)
            fault.detail = f"{name} (pid {proc.pid}) SIGSTOPped for {self.cfg.hang_s:g} s, then SIGCONTed"
            time.sleep(self.cfg.hang_s)
            proc.send_signal(signal.SIGCONT)
            fault.back_t = time.monotonic() - self.t0

            def back() -> bool:
                _, endpoints = ray.get(actors.datastore.snapshot.remote(), timeout=10)
                return name in {e.name for e in endpoints}
        elif kind == "kv-publisher":
            if not self.cfg.kv_events:
                raise ValueError("the kv-publisher fault needs --kv-events")
            name = sorted(self.pod_procs)[k % len(self.pod_procs)]
            profile = next(iter(actors.profiles.values()))
            proc = self.pod_procs[name]
            proc.send_signal(signal.SIGKILL)  # the publisher lives in the pod's process
            proc.wait(10)
            self.start_pod(name)  # at once, on the same HTTP and PUB ports
            fault.back_t = time.monotonic() - self.t0
            before = ray.get(profile.kv_events.remote(), timeout=30)["streams"].get(name, {}).get("batches", 0)
            fault.detail = f"{name}'s KV-event publisher (its process) killed and started again on its port"

            def back() -> bool:  # the profile actor receives the new publisher's events
                stream = ray.get(profile.kv_events.remote(), timeout=10)["streams"].get(name, {})
                return stream.get("batches", 0) > before
        elif kind == "datastore":
            pid = ray.get(actors.datastore.debug_info.remote(), timeout=30)["pid"]
            ray.kill(actors.datastore, no_restart=False)
            fault.detail = "datastore actor killed (Ray restarts it)"

            def back() -> bool:  # a new incarnation that publishes the pool again
                if ray.get(actors.datastore.debug_info.remote(), timeout=10)["pid"] == pid:
                    return False
                return ray.get(actors.datastore.snapshot.remote(), timeout=10)[1] != []
        elif kind == "metrics-actor":
            groups = retry(lambda: ray.get(actors.datastore.metrics_actors.remote(), timeout=10))
            pod = sorted(groups)[k % len(groups)]  # pod name -> its metrics actor
            handle = groups[pod]
            pid = ray.get(handle.stats.remote(), timeout=30)["pid"]
            ray.kill(handle, no_restart=False)
            fault.detail = f"the metrics actor of {pod} killed"

            def back() -> bool:  # a new incarnation that scrapes
                stats = ray.get(handle.stats.remote(), timeout=10)
                return stats["pid"] != pid and stats["scrapes"] > 0
        elif kind == "profile-actor":
            name = sorted(actors.profiles)[k % len(actors.profiles)]
            handle = actors.profiles[name]
            pid = ray.get(handle.info.remote(), timeout=30)["pid"]
            ray.kill(handle, no_restart=False)
            fault.detail = f"profile actor {name} killed"

            def back() -> bool:  # a new incarnation holding a snapshot
                info = ray.get(handle.info.remote(), timeout=10)
                return info["pid"] != pid and bool(info["endpoints"])
        elif kind == "gateway-replica":
            from ray import serve

            # Serve names its replicas' actors SERVE_REPLICA::<app>#<deployment>#<id>
            victims = sorted(n for n in replica_actor_names() if f"::{self.dep.app_name}#Gateway#" in n)
            victim = victims[k % len(victims)]
            ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)
            fault.detail = f"gateway replica {victim} killed (Serve replaces it)"
            fault.replicas_lost = 1

            def back() -> bool:  # a replacement runs (and, being RUNNING, serves the port)
                names = [n for n in replica_actor_names() if f"::{self.dep.app_name}#Gateway#" in n]
                if victim in names or not set(names) - set(victims):
                    return False
                deployment = serve.status().applications[self.dep.app_name].deployments["Gateway"]
                return deployment.replica_states.get("RUNNING", 0) >= self.cfg.replicas
        elif kind == "node":
            if self.cluster is None:
                raise ValueError("the node fault needs --nodes")
            back = self.cluster.lose_node(fault, k, self.dep)
            fault.back_t = time.monotonic() - self.t0
        else:
            raise ValueError(f"unknown fault {kind!r}; known: {', '.join(FAULTS)}")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                if back():
                    fault.recovered_s = round(time.monotonic() - self.t0 - fault.t, 1)
                    break
            time.sleep(0.25)
        return fault

    async def fault_loop(self, seconds: float) -> None:
        k = 0
        every = self.cfg.fault_every_s
        while self.cfg.faults and (k + 1) * every < seconds - 5:
            await asyncio.sleep(max(0.0, self.t0 + (k + 1) * every - time.monotonic()))
            kind = self.cfg.faults[k % len(self.cfg.faults)]
            try:
                fault = await asyncio.to_thread(self.inject, kind, k // len(self.cfg.faults))
            except Exception as err:  # reported, and the soak goes on
                fault = Fault(kind, time.monotonic() - self.t0, f"could not inject: {err!r}")
            self.faults.append(fault)
            print(f"[{fault.t:7.1f} s] fault: {fault.kind}: {fault.detail}", flush=True)
            k += 1


def retry(fn: Any, timeout_s: float = 60.0) -> Any:
    """fn() until it answers (a restarting actor is unavailable for a while)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return fn()
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def replica_actor_names() -> list[str]:
    from ray.util import list_named_actors

    return [a["name"] for a in list_named_actors(all_namespaces=True) if a.get("namespace") == "serve"]
