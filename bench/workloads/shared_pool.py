"""`cache-pressure-shared`: `cache-pressure-drift` on a pool that the gateway shares with clients
that reach the pods without it.

What it adds to `cache-pressure-drift` (the engine's real tokenizer, prose and hex content, chat
requests, prefixes ~3.6x the pool's KV cache), and why an operator meets it:

* **A second way into the pods.** A third of the requests (each one, drawn with its own seeded
  generator) come from clients that call the model servers' Kubernetes Service directly, not the
  inference gateway: batch and evaluation jobs, an internal service wired before the gateway
  existed, a second gateway deployment in front of the same pool. The Service (kube-proxy) sends
  each of them to a pod drawn uniformly at random. They belong to the same application, so they
  draw from the same groups and prompts as the gateway's requests.
* **What each router is told, exactly as in reality.** The router under test sees only the
  gateway's requests: its approximate index (and sglang-router's tree) learns only from its own
  decisions. It does see the direct traffic's *load*, through the pods' scraped metrics (queue,
  KV usage), as a real scraper would. The precise index gets every pod's KV events, which cover
  every block the pod caches and evicts, whoever sent the prompt. So the direct clients create the
  two facts only the events can show: prefixes cached on pods the router never sent them to, and
  blocks evicted by traffic the router never saw (the approximate index believes they are still
  there).

Figures are taken over the gateway's requests (what the router decides); the direct clients' TTFT
is reported beside them. Capacity is calibrated as every scenario's, with round-robin for all the
traffic (the pool's capacity does not depend on who sends it). Not modelled: engine restarts (rare
at real rates, and packed into a 20 s run they would measure a pool an eighth short rather than
routing; the simulated pods stay up) and blocks freed by preemption beyond what the simulated
engine does itself."""

from __future__ import annotations

from bench.workloads.common import seeded
from bench.workloads.drift import drift_workload
from bench.workloads.shared_prefix import CACHE_PRESSURE, SharedPrefixSpec
from ray_epp.simulator import SimRequest

DIRECT_SHARE = 1 / 3  # of all requests: sent to the pods' Service, not the gateway
TRAFFIC_HEADER = "x-bench-traffic"  # the workload's mark; no router reads it
DIRECT = "direct"


def is_direct(request: SimRequest) -> bool:
    return request.headers.get(TRAFFIC_HEADER) == DIRECT


def shared_pool_workload(
    rate: float,
    seed: int = 0,
    num_requests: int | None = None,
    spec: SharedPrefixSpec = CACHE_PRESSURE,
    direct_share: float = DIRECT_SHARE,
) -> list[SimRequest]:
    """`drift_workload` at the pool's total `rate`, a `direct_share` of it marked direct."""
    requests = drift_workload(rate, seed, num_requests, spec)
    rng = seeded(seed, "cache-pressure-shared")
    for r in requests:
        if rng.random() < direct_share:
            r.headers[TRAFFIC_HEADER] = DIRECT
    return requests
