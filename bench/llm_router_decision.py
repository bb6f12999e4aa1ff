"""In-process cost of one `EPPRequestRouter.choose_replicas` decision, without Ray Serve.

The router is built as Serve builds it (its constructor, then `initialize_state` with
ray_epp/configs/default.yaml) and marked attached, so it decides on its local mirror and no profile actor
is started. The replicas are stand-ins carrying what Serve's `RunningReplica` carries (replica id,
metadata, routing stats as bench/serve_llm_replica.py publishes them); the requests are the
shared-prefix workload of bench/serve_llm_routing.py as vLLM-style pydantic requests. Each decision
is followed by `on_request_routed`, and a request completes `--inflight` decisions later, so the
mirror's prefix index and in-flight ledger hold what they hold in the Serve benchmark.

This is the router's own Python, one decision at a time on an idle loop: not the Serve benchmark's
end-to-end figure (which adds Serve's queueing, the mirror's syncs sharing the loop, and load).

    .venv/bin/python -m bench.llm_router_decision [--replicas 4,16] [--requests 2000] [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import time
from dataclasses import dataclass, field
from typing import Any

from ray.serve._private.common import DeploymentHandleSource, DeploymentID, ReplicaID, RequestMetadata
from ray.serve._private.request_router.common import PendingRequest

from bench.serve_llm_replica import request_model
from bench.serve_llm_workloads import Shape, workload
from serve_app.llm_router.router import EPPRequestRouter, percentiles_ms
from serve_app.llm_router.stats import METRICS_URL_KEY, engine_routing_stats

DEPLOYMENT = "FakeLLM"


@dataclass(slots=True, eq=False)
class StandInReplica:
    """What `EPPRequestRouter` reads of a Serve `RunningReplica`."""

    replica_id: ReplicaID
    replica_metadata: dict[str, Any]
    routing_stats: dict[str, Any]
    node_id: str = "node-0"
    availability_zone: str | None = None
    multiplexed_model_ids: set[str] = field(default_factory=set)
    backend_http_endpoint: tuple[str, int] | None = None
    max_ongoing_requests: int = 64

    async def get_queue_len(self, *, deadline_s: float) -> int:  # Serve probes new replicas
        return 0

    @property
    def actor_id(self) -> str:
        return self.replica_id.unique_id


def replicas(n: int) -> list[StandInReplica]:
    out = []
    for i in range(n):
        rid = ReplicaID(unique_id=f"r{i:02d}", deployment_id=DeploymentID(name=DEPLOYMENT, app_name="bench"))
        stats = engine_routing_stats(waiting=i % 3, running=4 + i % 5, kv_cache_usage=0.1 * (i % 7),
                                     max_lora=4, block_size=16, num_blocks=1024)  # fmt: skip
        out.append(StandInReplica(rid, {METRICS_URL_KEY: f"http://127.0.0.1:{9000 + i}/metrics"}, stats))
    return out


def router() -> EPPRequestRouter:
    r = EPPRequestRouter(deployment_id=DeploymentID(name=DEPLOYMENT, app_name="bench"),
                         handle_source=DeploymentHandleSource.UNKNOWN)  # fmt: skip
    r.initialize_state(config="ray_epp/configs/default.yaml")  # scrape_metrics on, as in Serve (nothing to scrape)
    r._attached = True  # decide on the mirror; no profile actors
    return r


async def run(n_replicas: int, n_requests: int, inflight: int, profile: cProfile.Profile | None) -> dict[str, Any]:
    epp = router()
    reps = replicas(n_replicas)
    epp.update_replicas(reps)  # type: ignore[arg-type]
    requests = workload("shared-prefix", Shape(requests=n_requests), seed=0)
    pending: list[tuple[str, StandInReplica]] = []
    samples: list[float] = []
    for i, sim in enumerate(requests):
        meta = RequestMetadata(request_id=f"q{i}", internal_request_id=f"q{i}", call_method="completions")
        pr = PendingRequest(args=[request_model(sim.body)], kwargs={}, metadata=meta)
        if profile is not None:
            profile.enable()
        started = time.perf_counter()
        ranked = await epp.choose_replicas(reps, pr)  # type: ignore[arg-type]
        samples.append(time.perf_counter() - started)
        chosen = ranked[0][0]
        epp.on_request_routed(pr, chosen.replica_id, None)
        if profile is not None:
            profile.disable()
        pending.append((meta.internal_request_id, chosen))
        if len(pending) > inflight:
            iid, done = pending.pop(0)
            epp.on_request_completed(done.replica_id, iid)
    assert epp.counters.scheduled == n_requests, epp.counters.as_dict()
    warm = samples[len(samples) // 10 :]  # the first tenth fills the index
    return {"replicas": n_replicas, "requests": n_requests} | percentiles_ms(warm)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replicas", default="4,16")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--inflight", type=int, default=40, help="decisions between a request and its completion")
    ap.add_argument("--profile", action="store_true", help="cProfile the decisions (slower), print the top")
    args = ap.parse_args()
    print(f"load average before: {os.getloadavg()}")
    for n in (int(x) for x in args.replicas.split(",")):
        prof = cProfile.Profile() if args.profile else None
        row = asyncio.run(run(n, args.requests, args.inflight, prof))
        print(f"{n:>3} replicas: choose_replicas p50 {row['p50']:.3f} ms  p90 {row['p90']:.3f} ms  "
              f"p99 {row['p99']:.3f} ms  (n={row['n']})")  # fmt: skip
        if prof is not None:
            pstats.Stats(prof).sort_stats("cumulative").print_stats(35)
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
