"""Which requests make a policy's TTFT p90 under cache pressure, and what speculative entries change:
one seed, the policies of bench/precise_routing.py on the same requests (the gateway's requests;
direct clients apart).

    python -m bench.precise_p90_trace [--scenario cache-pressure-shared] [--seed 0] [--rate 0.9]
        [--capacity 48.4] [--duration 20] [--policies epp-default,epp-precise,epp-precise-speculative]

Per policy: the p90 and its floor (the p90 without queue waits); the requests at or over the p90
(the tail): how many had no cache hit, their prompt length, queue wait and service time against
everyone's, and when they arrived (per 2 s of arrivals, the tail's count and the pool's arrivals);
the affinity filter's decisions; the router's predicted cached tokens against what the pods served
(over: predicted more than one block above what was served; under: one block below); with
speculative entries, how many were made and expired. Then, per pair of policies, the requests
sent to another pod and what that did to their cached tokens and TTFT."""

from __future__ import annotations

import argparse
import os
import statistics
from collections import Counter
from typing import Any

from bench.precise_routing import run_policy
from bench.workloads.shared_pool import is_direct
from ray_epp.simulator.report import OK, Dist, RequestResult

BIN_S = 2.0  # seconds of arrivals per bin of the tail's timeline
FILTER = "prefix-cache-affinity-filter"


class PredictionLog:
    """Wraps a SchedulerRouter's completion hook to keep, per request, the cached tokens its prefix
    index predicted on the chosen pod (None when the router predicts none)."""

    def __init__(self, router: Any) -> None:
        self.router, self.predicted = router, {}
        self._complete = router.on_complete
        router.on_complete = self.on_complete

    def on_complete(self, request, pod, result) -> None:
        pending = getattr(self.router, "_predicted", {}).get(request.request_id)
        self.predicted[request.request_id] = pending
        self._complete(request, pod, result)


def trace_policy(scenario: str, policy: str, rate: float, duration: float, seed: int) -> dict[str, Any]:
    log: dict[str, PredictionLog] = {}

    def logged(router: Any) -> Any:  # before the run: the hook is read when a request completes
        if hasattr(router, "on_complete"):
            log["router"] = PredictionLog(router)
        return router

    requests, router, report = run_policy(scenario, policy, rate, duration, seed, wrap=logged)
    direct = {r.request_id for r in requests if is_direct(r)}
    ok = [r for r in report.results if r.status == OK and r.request_id not in direct]
    p90 = Dist.of(sorted(r.ttft for r in ok)).p90
    floor = Dist.of(sorted(r.ttft - r.queue_wait for r in ok)).p90
    tail = [r for r in ok if r.ttft >= p90]
    predicted = log["router"].predicted if "router" in log else {}
    over = under = 0
    for r in ok:
        guess = predicted.get(r.request_id)
        if guess is not None:
            over += guess[0] > r.cached_tokens + guess[1]
            under += guess[0] < r.cached_tokens - guess[1]
    plugins = getattr(getattr(router, "scheduler", None), "plugins", {})
    producer = next((p for p in plugins.values() if hasattr(p, "precise")), None)
    return {
        "policy": policy,
        "results": {r.request_id: r for r in ok},
        "arrivals": Counter(int(r.arrival // BIN_S) for r in report.results),
        "p90": p90,
        "floor": floor,
        "tail": tail,
        "all": ok,
        "filter": dict(plugins[FILTER].decisions) if FILTER in plugins else None,
        "over": over,
        "under": under,
        "speculative": producer.info().get("speculative") if producer is not None else None,
    }


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def describe(t: dict[str, Any]) -> str:
    tail, everyone = t["tail"], t["all"]

    def summary(rs: list[RequestResult]) -> str:
        cold = sum(r.cached_tokens == 0 for r in rs) / len(rs)
        return (
            f"{len(rs)} requests, {cold:.0%} cold, prompt {_mean([r.prompt_tokens for r in rs]):.0f} tokens, "
            f"queue wait {1000 * _mean([r.queue_wait for r in rs]):.0f} ms, "
            f"service {1000 * _mean([r.ttft - r.queue_wait for r in rs]):.0f} ms"
        )

    bins = Counter(int(r.arrival // BIN_S) for r in tail)
    timeline = " ".join(f"{b * BIN_S:.0f}s:{bins[b]}/{t['arrivals'][b]}" for b in sorted(t["arrivals"]))
    lines = [
        f"## {t['policy']}: TTFT p90 {1000 * t['p90']:.0f} ms, floor (no queueing) {1000 * t['floor']:.0f} ms",
        f"  tail (>= p90): {summary(tail)}",
        f"  everyone:      {summary(everyone)}",
        f"  tail per {BIN_S:.0f} s of arrivals (tail/arrivals): {timeline}",
        f"  predicted cached tokens: over {t['over']}, under {t['under']} of {len(everyone)}",
    ]
    if t["filter"] is not None:
        lines.append(f"  affinity filter: {t['filter']}")
    if t["speculative"] is not None:
        lines.append(f"  speculative entries: {t['speculative']}")
    return "\n".join(lines)


def compare(a: dict[str, Any], b: dict[str, Any]) -> str:
    """The requests the two policies sent to other pods, and what it did to them."""
    ra, rb = a["results"], b["results"]
    moved = [i for i in ra if i in rb and ra[i].pod != rb[i].pod]
    more = sum(rb[i].cached_tokens > ra[i].cached_tokens for i in moved)
    less = sum(rb[i].cached_tokens < ra[i].cached_tokens for i in moved)
    faster = sum(rb[i].ttft < ra[i].ttft for i in moved)
    return (
        f"{b['policy']} against {a['policy']}: {len(moved)} of {len(ra)} requests on another pod; "
        f"there {more} got more cached tokens, {less} fewer; {faster} a lower TTFT"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenario", default="cache-pressure-shared")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rate", type=float, default=0.9, help="fraction of --capacity")
    ap.add_argument("--capacity", type=float, default=48.4, help="req/s (round-robin's)")
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--policies", default="epp-default,epp-precise,epp-precise-speculative")
    args = ap.parse_args()
    load = os.getloadavg()[0]
    print(f"{args.scenario} seed {args.seed} at {args.rate} x {args.capacity} req/s, load average {load:.2f}")
    traces = [
        trace_policy(args.scenario, p, args.rate * args.capacity, args.duration, args.seed)
        for p in args.policies.split(",")
    ]
    for t in traces:
        print(describe(t))
    for t in traces[1:]:
        print(compare(traces[0], t))
    if len(traces) > 2:
        print(compare(traces[1], traces[2]))
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
