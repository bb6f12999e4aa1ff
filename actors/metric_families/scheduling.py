"""Scheduling families (the profile actors' decisions, plugins' latencies) and the prefix indexer's
(approx-prefix-cache-producer)."""

from __future__ import annotations

from actors.metric_families.buckets import HIT_BYTES, HIT_RATIO, SCHEDULER
from actors.metric_families.family import COUNTER, GAUGE, GIE_LLMD, HISTOGRAM, LLMD, PLUGIN, Family, add_families, view

# ---- scheduling ---------------------------------------------------------------------------------------
add_families(
    Family(
        "llm_d_epp_scheduler_e2e_duration_seconds",
        HISTOGRAM,
        "Scheduling latency (every cycle of a request).",
        (),
        SCHEDULER,
        LLMD,
    ),
    Family(
        "llm_d_epp_scheduler_attempts_total",
        COUNTER,
        "Scheduling attempts, by outcome and primary target.",
        ("status", "target_model_name", "endpoint_name", "namespace", "port"),
        origin=LLMD,
    ),
    Family(
        "inference_extension_plugin_duration_seconds",
        HISTOGRAM,
        "Plugin latency, per extension point and plugin.",
        ("extension_point", "plugin_type", "plugin_name"),
        SCHEDULER,
        GIE_LLMD,
    ),
)
add_families(
    view(
        "inference_extension_scheduler_e2e_duration_seconds",
        "llm_d_epp_scheduler_e2e_duration_seconds",
        "Scheduling latency (every cycle of a request).",
        (),
    ),
    view(
        "inference_extension_scheduler_attempts_total",
        "llm_d_epp_scheduler_attempts_total",
        "Scheduling attempts, by outcome and primary target.",
        ("status", "target_model_name", "pod_name", "namespace", "port"),
        view_labels=("status", "target_model_name", "endpoint_name", "namespace", "port"),
    ),
    view(
        "llm_d_epp_plugin_duration_seconds",
        "inference_extension_plugin_duration_seconds",
        "Plugin latency, per extension point and plugin.",
        ("extension_point", "plugin_type", "plugin_name"),
        LLMD,
    ),
)

# ---- the prefix indexer (approx-prefix-cache-producer, in the profile actors) -----------------------------
add_families(
    Family("llm_d_epp_prefix_indexer_size", GAUGE, "Entries in the approximate prefix index.", PLUGIN, origin=LLMD),
    Family(
        "llm_d_epp_prefix_indexer_hit_ratio",
        HISTOGRAM,
        "Matched / total prompt blocks on the chosen endpoint, per scheduled request.",
        PLUGIN,
        HIT_RATIO,
        LLMD,
    ),
    Family(
        "llm_d_epp_prefix_indexer_hit_bytes",
        HISTOGRAM,
        "Matched prompt length on the chosen endpoint, in bytes (4 per token), per scheduled request.",
        PLUGIN,
        HIT_BYTES,
        LLMD,
    ),
)
add_families(
    view(
        "inference_extension_prefix_indexer_size", "llm_d_epp_prefix_indexer_size", "Entries in the prefix index.", ()
    ),
    view(
        "inference_extension_prefix_indexer_hit_ratio",
        "llm_d_epp_prefix_indexer_hit_ratio",
        "Matched / total prompt blocks on the chosen endpoint.",
        (),
    ),
    view(
        "inference_extension_prefix_indexer_hit_bytes",
        "llm_d_epp_prefix_indexer_hit_bytes",
        "Matched prompt length on the chosen endpoint, in bytes.",
        (),
    ),
)
