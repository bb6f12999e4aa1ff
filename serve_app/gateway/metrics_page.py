"""The gateway's `/metrics` page: every source's pushed state (the gateway replicas, the profile
actors) summed by the metrics hub, plus what is read when the page is asked for: the pool as the
answering replica sees it (GIE's / llm-d's pool gauges), the build, flow control's saturation and
band capacity, the answering replica's snapshot age and fairness-policy gauges, and the datastore's
pods and scrape errors. Families, labels and buckets: actors/metric_families/;
docs/OBSERVABILITY.md says what each means and what to do when it moves."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from typing import TYPE_CHECKING, Any

import ray_epp
from actors.metrics_hub import Key, render
from scheduler import Endpoint
from scheduler.admission import pool_saturation

if TYPE_CHECKING:
    from serve_app.gateway.core import GatewayCore

POOL = "default"  # the pool's name label (one pool per gateway)
COMMIT = ""  # no commit is recorded in a build of Ray EPP (GIE's default when none is set)
METRICS_SOURCE = "metrics-data-source"  # llm-d's data-source and extractor types, which the metrics actors are
METRICS_EXTRACTOR = "core-metrics-extractor"
DATASTORE_WAIT_S = 1.0  # the datastore's figures are left out of a page they would hold up


async def render_page(core: GatewayCore) -> bytes:
    core.ensure_started()
    states = [core.recorder.state()]
    if core.hub is not None and core.pusher is not None:
        await core.pusher.push_now()
        states = await core.hub.states.remote()
    extra: dict[Key, float] = {("llm_d_epp_info", (COMMIT, ray_epp.__version__)): 1.0}
    pool_samples(extra, core.view.endpoints)
    if core.view.adopted_at:
        extra[("ray_epp_gateway_snapshot_age_seconds", ())] = time.monotonic() - core.view.adopted_at
    if core.flow is not None:
        flow_samples(extra, core)
        if policy := core.flow.policy_gauges():
            # The answering replica's own fairness-policy gauges (not pushed: a mean or an index
            # summed over replicas would mean nothing).
            extra.update(policy)
    with contextlib.suppress(Exception):  # the datastore restarting: the page without its figures
        async with asyncio.timeout(DATASTORE_WAIT_S):
            datastore_samples(extra, await core.view.datastore.observability.remote())
    return render(states, extra)


def pool_samples(out: dict[Key, float], endpoints: list[Endpoint]) -> None:
    """The ready pods' count, and each signal's mean and sample standard deviation, rounded to two
    places (as llm-d's datalayer logger records them); the averages only when there is a pod."""
    n = len(endpoints)
    pool = (POOL,)
    out[("llm_d_epp_ready_endpoints", pool)] = float(n)
    if not n:
        return
    for ep in endpoints:
        out[("llm_d_epp_per_endpoint_queue_size", (POOL, ep.name))] = float(ep.metrics.waiting_queue_size)
    for name, values in (
        ("kv_cache_utilization", [ep.metrics.kv_cache_usage_percent for ep in endpoints]),
        ("queue_size", [float(ep.metrics.waiting_queue_size) for ep in endpoints]),
        ("running_requests", [float(ep.metrics.running_requests_size) for ep in endpoints]),
    ):
        mean = sum(values) / n
        spread = math.sqrt(sum((v - mean) ** 2 for v in values) / max(1, n - 1))
        out[(f"llm_d_epp_average_{name}", pool)] = round(mean, 2)
        out[(f"llm_d_epp_std_dev_{name}", pool)] = round(spread, 2)


def flow_samples(out: dict[Key, float], core: GatewayCore) -> None:
    """Saturation as the answering replica's flow control sees it, and each band's fill."""
    fc = core.flow.controller  # type: ignore[union-attr]
    out[("llm_d_epp_flow_control_pool_saturation", (POOL, "effective"))] = pool_saturation(
        fc.detectors, core.view.endpoints
    )
    for band in list(fc.bands.values()):
        labels = (core.priority_label(band.priority), POOL)
        for kind, used, cap in (("requests", band.size, band.max_requests), ("bytes", band.bytes, band.max_bytes)):
            key = (f"llm_d_epp_flow_control_capacity_utilization_{kind}", labels)
            out[key] = max(out.get(key, 0.0), used / cap if cap else 0.0)
    spec = fc.spec
    if spec.max_requests:
        out[("llm_d_epp_flow_control_global_capacity_utilization_requests", (POOL,))] = fc.size / spec.max_requests
    if spec.max_bytes:
        out[("llm_d_epp_flow_control_global_capacity_utilization_bytes", (POOL,))] = fc.bytes / spec.max_bytes


def datastore_samples(out: dict[Key, float], figures: dict[str, Any]) -> None:
    """Per pod its state and report age; the scrape errors the datastore counted."""
    for name, state, age in figures["pods"]:
        out[("ray_epp_pod_state", (name, state))] = 1.0
        if age is not None:
            out[("ray_epp_pod_report_age_seconds", (name,))] = age
    errors = figures["scrape_errors"]
    out[("llm_d_epp_datalayer_poll_errors_total", (METRICS_SOURCE,))] = float(errors["poll"])
    out[("llm_d_epp_datalayer_extract_errors_total", (METRICS_SOURCE, METRICS_EXTRACTOR))] = float(errors["extract"])
