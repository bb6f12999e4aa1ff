"""Families of the data path around scheduling: P/D disaggregation (the gateway, from the handler's
decision), the metrics actors' scrapes (counted by the datastore) and KV events (the profile
actors' subscribers)."""

from __future__ import annotations

from actors.metric_families.family import COUNTER, DECISION, GAUGE, LLMD, Family, add_families, view

# ---- P/D disaggregation (the gateway, from the handler's decision) ------------------------------------
add_families(
    Family(
        "llm_d_epp_disagg_decision_total",
        COUNTER,
        "disagg-profile-handler decisions, by stages used.",
        DECISION,
        origin=LLMD,
    ),
    Family(
        "llm_d_epp_pd_decision_total",
        COUNTER,
        "pd-profile-handler decisions (decode-only or prefill-decode).",
        DECISION,
        origin=LLMD,
    ),
)
add_families(
    view(
        "llm_d_inference_scheduler_disagg_decision_total",
        "llm_d_epp_disagg_decision_total",
        "disagg-profile-handler decisions, by stages used.",
        ("model_name", "decision_type"),
        LLMD,
    ),
    view(
        "llm_d_inference_scheduler_pd_decision_total",
        "llm_d_epp_pd_decision_total",
        "pd-profile-handler decisions.",
        ("model_name", "decision_type"),
        LLMD,
    ),
)

# ---- the data layer: the metrics actors' scrapes, counted by the datastore -------------------------------
add_families(
    Family(
        "llm_d_epp_datalayer_poll_errors_total",
        COUNTER,
        "Failed scrapes of model servers' metrics pages.",
        ("source_type",),
        origin=LLMD,
    ),
    Family(
        "llm_d_epp_datalayer_extract_errors_total",
        COUNTER,
        "Metrics pages that could not be read as metrics.",
        ("source_type", "extractor_type"),
        origin=LLMD,
    ),
)
add_families(
    view(
        "llm_d_inference_scheduler_datalayer_poll_errors_total",
        "llm_d_epp_datalayer_poll_errors_total",
        "Failed scrapes of model servers' metrics pages.",
        ("source_type",),
        LLMD,
    ),
    view(
        "llm_d_inference_scheduler_datalayer_extract_errors_total",
        "llm_d_epp_datalayer_extract_errors_total",
        "Metrics pages that could not be read as metrics.",
        ("source_type", "extractor_type"),
        LLMD,
    ),
)

# ---- KV events (the profile actors' subscribers) ------------------------------------------------------
add_families(
    Family(
        "llm_d_epp_kv_cache_events_active_subscribers",
        GAUGE,
        "KV-event subscribers running, over every profile actor that subscribes.",
        origin=LLMD,
    ),
    Family(
        "llm_d_epp_kv_cache_events_messages_received_total",
        COUNTER,
        "KV-event batches received per pod, over every profile actor that subscribes.",
        ("pod_identifier",),
        origin=LLMD,
    ),
    Family(
        "llm_d_epp_kv_cache_events_pool_queue_depth",
        GAUGE,
        "KV-event batches received and not yet given to the plugins.",
        origin=LLMD,
    ),
)
