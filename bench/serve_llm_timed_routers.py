"""Serve's request routers for bench/serve_llm_routing.py, timed: thin subclasses that time
`choose_replicas` and stamp each request's steps in the router (nothing else changes), and the
router config of each router name (EPPRequestRouter's variants included). Serve imports these
classes by name (`MODULE`), so they live in a module of their own, never `__main__`."""

from __future__ import annotations

import asyncio
import importlib
import time
from typing import Any

from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router import PrefixCacheAffinityRouter
from ray.serve._private.request_router.pow_2_router import PowerOfTwoChoicesRequestRouter
from ray.serve.config import RequestRouterConfig

from serve_app.llm_router.router import EPPRequestRouter

MODULE = "bench.serve_llm_timed_routers"  # Serve imports the router classes by this name
ROUTERS = ("epp", "pow2", "prefix-affinity")
STATS_PERIOD_S = 0.2  # the replicas' routing stats period every router gets


# --- Serve's routers, timed ------------------------------------------------------------------------


def choose_samples() -> dict[str, tuple[str, list[float]]]:
    """Deployment name -> (the timed router's class, its choose_replicas durations), in this process
    (kept in the imported module: Serve ships router classes with cloudpickle, whose copies have
    globals of their own)."""
    return vars(importlib.import_module(MODULE)).setdefault("_CHOOSE_S", {})


def request_timelines() -> dict[str, dict[str, float]]:
    """Internal request id -> when (wall clock) Serve made its pending request, the router first
    began and last ended choose_replicas, and Serve reported it routed; in this process (see
    `choose_samples`)."""
    return vars(importlib.import_module(MODULE)).setdefault("_TIMELINES", {})


def router_loops() -> dict[str, asyncio.AbstractEventLoop]:
    """Deployment name -> the event loop its router runs on (Serve runs routers on a loop of their
    own, in another thread than the caller's); in this process (see `choose_samples`)."""
    return vars(importlib.import_module(MODULE)).setdefault("_ROUTER_LOOPS", {})


class _Timed:
    """Times choose_replicas and stamps each request's steps in the router (every router alike)."""

    times_itself = False  # EPPRequestRouter keeps its own choose_replicas samples

    async def choose_replicas(self, candidate_replicas, pending_request=None):  # type: ignore[no-untyped-def]
        started, wall = time.perf_counter(), time.time()
        try:
            return await super().choose_replicas(candidate_replicas, pending_request)  # type: ignore[misc]
        finally:
            if pending_request is not None:
                name = self._deployment_id.name  # type: ignore[attr-defined]
                router_loops()[name] = self._event_loop  # type: ignore[attr-defined]
                if not self.times_itself:
                    samples = choose_samples().setdefault(name, (type(self).__name__, []))[1]
                    samples.append(time.perf_counter() - started)
                first = {"created": pending_request.created_at, "choose_start": wall}
                line = request_timelines().setdefault(pending_request.metadata.internal_request_id, first)
                line["choose_end"] = time.time()

    def on_request_routed(self, pending_request, replica_id, result):  # type: ignore[no-untyped-def]
        line = request_timelines().get(pending_request.metadata.internal_request_id)
        if line is not None:
            line["routed"] = time.time()
        super().on_request_routed(pending_request, replica_id, result)  # type: ignore[misc]


class TimedPowerOfTwo(_Timed, PowerOfTwoChoicesRequestRouter):
    """Serve's default router, timed."""


class TimedEPP(_Timed, EPPRequestRouter):
    """EPPRequestRouter with the same per-request stamps as Serve's two (it times choose itself)."""

    times_itself = True


class TimedPrefixCacheAffinity(_Timed, PrefixCacheAffinityRouter):
    """ray.llm's PrefixCacheAffinityRouter (its defaults), timed."""


# EPPRequestRouter, and with its Serve-side mechanisms off one by one (`--routers`, to measure them):
# "learn-routed", the mirror learns a decision when Serve reports it routed, not when it is made;
# "completion-only", no first tokens inferred from the published queues (the ledger holds a prompt
# until the request completes); "before" both, as the router was before these mechanisms.
EPP_VARIANTS: dict[str, dict[str, Any]] = {
    "epp": {},
    "epp-learn-routed": {"learn_on_decision": False},
    "epp-completion-only": {"infer_first_token": False},
    "epp-before": {"learn_on_decision": False, "infer_first_token": False},
    "epp-sync50": {"sync_interval_s": 0.05},
    "epp-traced": {"trace_decisions": 5000},  # each decision's scores in the answers (`--details`)
    # prefill-eta-scorer instead of prefill-backlog-scorer (epp_config): a pending prompt fades over
    # its predicted TTFT, so a first token inferred late (the routing-stats period) does not hold it
    # at full weight.
    "epp-eta": {},
}


def epp_config(workload: str, router: str = "epp") -> str:
    if router == "epp-eta":
        return "bench/configs/lora-eta.yaml" if workload == "multi-lora" else "bench/configs/default-eta.yaml"
    return "ray_epp/configs/lora.yaml" if workload == "multi-lora" else "ray_epp/configs/default.yaml"


def router_config(router: str, workload: str) -> RequestRouterConfig:
    if router in EPP_VARIANTS:
        cls, kwargs = f"{MODULE}:TimedEPP", {"config": epp_config(workload, router)} | EPP_VARIANTS[router]
    elif router == "pow2":
        cls, kwargs = f"{MODULE}:TimedPowerOfTwo", {}
    elif router == "prefix-affinity":
        cls, kwargs = f"{MODULE}:TimedPrefixCacheAffinity", {}
    else:
        raise ValueError(f"unknown router {router!r}; choose from {ROUTERS}")
    return RequestRouterConfig(
        request_router_class=cls,
        request_router_kwargs=kwargs,
        request_routing_stats_period_s=STATS_PERIOD_S,
        request_routing_stats_timeout_s=2.0,
    )
