"""The pool and the build: families computed when /metrics is read
(serve_app/gateway/metrics_page.py)."""

from __future__ import annotations

from actors.metric_families.family import GAUGE, LLMD, POOL, Family, add_families, view

# ---- the pool and the build, computed when /metrics is read (serve_app/gateway/metrics_page.py) ---------------
add_families(
    Family("llm_d_epp_info", GAUGE, "The build: commit and version (build_ref).", ("commit", "build_ref"), origin=LLMD),
    Family(
        "llm_d_epp_average_kv_cache_utilization", GAUGE, "Mean KV-cache use over the ready pods.", POOL, origin=LLMD
    ),
    Family("llm_d_epp_average_queue_size", GAUGE, "Mean waiting requests over the ready pods.", POOL, origin=LLMD),
    Family(
        "llm_d_epp_average_running_requests", GAUGE, "Mean running requests over the ready pods.", POOL, origin=LLMD
    ),
    Family(
        "llm_d_epp_std_dev_kv_cache_utilization",
        GAUGE,
        "Standard deviation of KV-cache use over the ready pods.",
        POOL,
        origin=LLMD,
    ),
    Family(
        "llm_d_epp_std_dev_queue_size",
        GAUGE,
        "Standard deviation of waiting requests over the ready pods.",
        POOL,
        origin=LLMD,
    ),
    Family(
        "llm_d_epp_std_dev_running_requests",
        GAUGE,
        "Standard deviation of running requests over the ready pods.",
        POOL,
        origin=LLMD,
    ),
    Family("llm_d_epp_ready_endpoints", GAUGE, "Pods the datastore serves (ready, fresh metrics).", POOL, origin=LLMD),
    Family(
        "llm_d_epp_per_endpoint_queue_size",
        GAUGE,
        "Waiting requests per ready pod.",
        ("name", "model_server_endpoint"),
        origin=LLMD,
    ),
)
add_families(
    view(
        "inference_extension_info",
        "llm_d_epp_info",
        "The build: commit and version (build_ref).",
        ("commit", "build_ref"),
    ),
    view(
        "inference_pool_average_kv_cache_utilization",
        "llm_d_epp_average_kv_cache_utilization",
        "Mean KV-cache use over the ready pods.",
        POOL,
    ),
    view(
        "inference_pool_average_queue_size",
        "llm_d_epp_average_queue_size",
        "Mean waiting requests over the ready pods.",
        POOL,
    ),
    view(
        "inference_pool_average_running_requests",
        "llm_d_epp_average_running_requests",
        "Mean running requests over the ready pods.",
        POOL,
    ),
    view("inference_pool_ready_pods", "llm_d_epp_ready_endpoints", "Pods the datastore serves.", POOL),
    view(
        "inference_pool_per_pod_queue_size",
        "llm_d_epp_per_endpoint_queue_size",
        "Waiting requests per ready pod.",
        ("name", "model_server_pod"),
        view_labels=("name", "model_server_endpoint"),
    ),
)
