"""The soak on several Ray nodes (bench/soak.py --nodes N): a `ray.cluster_utils.Cluster` on this
machine with a head that runs no actor (0 CPUs: Serve's controller and proxy, the driver) and N
workers of 2 CPUs, Ray's task events as `epp up` and deploy/rayservice.yaml set them, and the
`node` fault: a worker node removed without warning (its raylet, its workers, every actor and
gateway replica on it gone at once) and a new worker node added `--pod-down` seconds later, as an
autoscaler would. The victim is, in turn, the node of the default profile's primary actor and the
node of the datastore. The pods are outside Ray (like model servers on machines of their own), so
a node loss takes no pod with it."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bench.soak import SoakConfig
    from bench.soak_faults import Fault

NAMESPACE = "ray-epp-soak"


def node_base_port(port: int) -> int:
    """The first of the nodes' fixed ports (20 a node slot; the head's GCS at base - 10)."""
    return port + 400


# Every worker carries the worker role: the datastore prefers it (ActorOptions.datastore_node_labels),
# so it runs on a node the soak can lose rather than on the head.
WORKER_ROLE = {"epp/role": "worker"}


def worker_labels(name: str) -> dict[str, str]:
    return {"epp/host": name, **WORKER_ROLE}


@contextlib.contextmanager
def sigterm_handlers_skipped() -> Iterator[None]:
    """Adding a node from the fault thread: Ray's `Node` registers a SIGTERM handler, which
    Python allows only in the main thread; the driver's own handler (set when it attached) stays."""
    import ray._private.utils as ray_utils

    original = ray_utils.set_sigterm_handler
    ray_utils.set_sigterm_handler = lambda handler: None
    try:
        yield
    finally:
        ray_utils.set_sigterm_handler = original


@dataclass
class SoakCluster:
    """The soak's cluster: its nodes and their losses."""

    cfg: SoakConfig
    cluster: Any = None
    node_ids: dict[str, str] = field(default_factory=dict)
    nodes: dict[str, Any] = field(default_factory=dict)
    session_dir: str = ""
    _cluster_gen: Iterator[tuple] | None = None
    _next_slot: int = 0
    _lost: int = 0

    def start(self) -> str:
        """Start the cluster, attach this driver, start Serve's proxy on the head; returns the
        address to launch on."""
        from ray import serve

        from bench.local_cluster import WORKER_ATTEMPTS, start_cluster
        from serve_app.cli.launch import GCS_TASK_EVENTS_KEPT, TASK_EVENTS_REPORT_INTERVAL_MS

        os.environ.setdefault("RAY_task_events_report_interval_ms", TASK_EVENTS_REPORT_INTERVAL_MS)
        os.environ.setdefault("RAY_task_events_max_num_task_in_gcs", str(GCS_TASK_EVENTS_KEPT))
        workers = {f"w{i}": worker_labels(f"w{i}") for i in range(1, self.cfg.nodes + 1)}
        base = node_base_port(self.cfg.port)
        self._cluster_gen = start_cluster(workers, head_cpus=0, worker_cpus=2, base=base, namespace=NAMESPACE)
        self.cluster, self.node_ids, self.nodes, self.session_dir = next(self._cluster_gen)
        self._next_slot = 1 + self.cfg.nodes * WORKER_ATTEMPTS  # past every slot the start may have used
        serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": self.cfg.port + 88})
        return self.cluster.address

    def stop(self) -> None:
        if self._cluster_gen is not None:
            self._cluster_gen.close()  # ray.shutdown, then every node's processes
            self._cluster_gen = None

    def lose_node(self, fault: Fault, k: int, dep: Any) -> Any:
        """Remove the node of the primary profile actor (k even) or of the datastore (k odd),
        then add a new worker; returns `back`: every actor alive off the lost node, the profile
        pair whole, the gateway's replicas all running."""
        import ray
        from ray import serve

        from bench.local_cluster import actor_node, actor_state, add_worker_node, gateway_replicas

        actors = dep.actors
        primary = next(iter(actors.shards.values()))[0]
        pair = [primary] + ([next(iter(actors.standbys.values()))[0]] if actors.standbys else [])
        target = primary if k % 2 == 0 else actors.datastore  # the datastore prefers the workers
        lost_id = actor_node(target)
        name = next(n for n, i in self.node_ids.items() if i == lost_id)
        if name == "head":
            raise RuntimeError("the victim actor runs on the head, which the soak does not remove")
        on_it = [what for what, a in (("primary", pair[0]), ("standby", pair[-1]), ("datastore", actors.datastore))
                 if (what != "standby" or len(pair) > 1) and actor_node(a) == lost_id]  # fmt: skip
        replicas = sum(1 for n in gateway_replicas(dep.app_name).values() if n == lost_id)
        fault.replicas_lost = replicas
        self.cluster.remove_node(self.nodes.pop(name), allow_graceful=False)
        del self.node_ids[name]
        fault.detail = (f"node {name} removed ({', '.join(on_it) or 'no singleton actor'}, {replicas} gateway "
                        f"replica(s)); a new node added after {self.cfg.pod_down_s:g} s")  # fmt: skip
        time.sleep(self.cfg.pod_down_s)
        self._lost += 1
        new = f"w{self.cfg.nodes + self._lost}"
        with sigterm_handlers_skipped():  # Ray's Node sets one, which only the main thread may
            node = add_worker_node(self.cluster, self.session_dir, node_base_port(self.cfg.port), self._next_slot,
                                   stride=1, num_cpus=2, labels=worker_labels(new))  # fmt: skip
        self._next_slot += 3
        self.nodes[new], self.node_ids[new] = node, node.node_id

        def back() -> bool:
            alive = [actors.datastore, *pair]
            if any(actor_state(a) != "ALIVE" or actor_node(a) == lost_id for a in alive):
                return False
            if lost_id in gateway_replicas(dep.app_name).values():
                return False
            deployment = serve.status().applications[dep.app_name].deployments["Gateway"]
            return deployment.replica_states.get("RUNNING", 0) >= self.cfg.replicas and bool(
                ray.get(actors.datastore.snapshot.remote(), timeout=10)[1]
            )

        return back
