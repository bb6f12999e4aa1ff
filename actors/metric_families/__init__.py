"""Every Prometheus family Ray EPP exports: GIE's EPP names (gateway-api-inference-extension
pkg/epp/metrics at 1748e829, its last commit with an EPP), llm-d-router's (pkg/epp/metrics and
its plugins' metrics at ebab6879: the `llm_d_epp_` names and the older names it still exports), and
Ray EPP's own under `ray_epp_`. Names, label names and bucket boundaries are theirs exactly;
docs/OBSERVABILITY.md has a row per family (and per family not exported, with the reason).

A family is either recorded (processes call `MetricsRecorder.inc / add_gauge / observe` with its
name, or a collector reports it) or a *view*: rendered from another family's samples with some of
its labels summed away (GIE's `inference_objective_request_total` is llm-d's
`llm_d_epp_request_total` without `fairness_id`), labels renamed, samples filtered, and for a
histogram coarser buckets (each a bound of the source's). So a request is recorded once however
many names show it, and the names can not disagree. A family that is not `exposed` is recorded for
its views only (TTFT and TPOT: GIE's and llm-d's differ in both labels and buckets).

Plain data and checks, no Ray: the hub, the recorders and the docs test read it. Each group of
families has its module (a view beside its source); importing this package registers them all.
"""

from __future__ import annotations

# Each module registers its families when imported, and /metrics lists them in this order.
# isort: off
from actors.metric_families import per_request, scheduling, pool, flow_control, data_path, ray_epp_own  # noqa: F401
# isort: on
from actors.metric_families.buckets import LLMD_TTFT
from actors.metric_families.family import COUNTER, GAUGE, HISTOGRAM, REGISTERED, Family

__all__ = ["BUCKETS", "COUNTER", "FAMILIES", "GAUGE", "HISTOGRAM", "LLMD_TTFT", "Family"]

FAMILIES: dict[str, Family] = dict(REGISTERED)
BUCKETS: dict[str, tuple[float, ...]] = {f.name: f.buckets for f in FAMILIES.values() if f.kind == HISTOGRAM}


def _check() -> None:
    for fam in FAMILIES.values():
        if fam.kind == HISTOGRAM and (not fam.buckets or list(fam.buckets) != sorted(set(fam.buckets))):
            raise ValueError(f"{fam.name}: buckets must be increasing")
        if fam.kind == COUNTER and not fam.name.endswith("_total"):
            raise ValueError(f"{fam.name}: a counter's name ends in _total")
        if fam.view_of is None:
            continue
        src = FAMILIES[fam.view_of]
        if src.view_of is not None or src.kind != fam.kind:
            raise ValueError(f"{fam.name}: a view of a recorded family of its own kind")
        wanted = fam.view_labels or fam.labels
        if len(wanted) != len(fam.labels) or not set(wanted) | {k for k, _ in fam.where} <= set(src.labels):
            raise ValueError(f"{fam.name}: labels {wanted} not all in {src.name}'s {src.labels}")
        if not set(fam.buckets) <= set(src.buckets):
            raise ValueError(f"{fam.name}: buckets not all among {src.name}'s")


_check()
