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

Plain data and checks, no Ray: the hub, the recorders and the docs test read it."""

from __future__ import annotations

from dataclasses import dataclass

GIE = "GIE"
LLMD = "llm-d"
GIE_LLMD = "GIE, llm-d"
OURS = "Ray EPP"

COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"

# ---- bucket boundaries (GIE's / llm-d's, value for value, their typos included) --------------------
GENERAL_LATENCY = (
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 45, 60,
    120, 180, 240, 300, 360, 480, 600, 900, 1200, 1800, 2700, 3600,
)  # fmt: skip
TPOT = (
    0.0005, 0.00205, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.125, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1,
    1.5, 2, 3, 4.5, 6, 12, 18, 24, 30, 36, 48, 60, 90, 120, 180, 270, 360,
)  # fmt: skip
LLMD_TTFT = GENERAL_LATENCY[:24]  # up to 120 s
LLMD_STREAMING_TPOT = (
    0.0005, 0.00205, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.125, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1, 2,
)  # fmt: skip
LLMD_ITL = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 2)
SCHEDULER = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)
REQUEST_BYTES = (
    64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144, 524288, 1048576, 2097152,
    4194304, 8388608, 16777216, 33554432, 67108864, 134217728, 268435456, 536870912, 1073741824,
)  # fmt: skip
RESPONSE_BYTES = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32778, 65536)
PROMPT_TOKENS = (
    1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32778, 65536, 131072, 262144, 524288, 1048576,
)  # fmt: skip
OUTPUT_TOKENS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
NTPOT = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
REQUEST_PROCESSING = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.015, 0.025, 0.04, 0.06, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
RESPONSE_PROCESSING = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5,
)  # fmt: skip
FLOW_QUEUE = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
HIT_RATIO = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
HIT_BYTES = (0, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
# Ray EPP's: a gateway -> profile actor batch, from ~100 us (same-node channel) to the 10 s call bound.
ROUND_TRIP = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)

# ---- label sets ---------------------------------------------------------------------------------
MODEL = ("model_name", "target_model_name")
MODEL_FLOW = (*MODEL, "fairness_id", "priority")
POOL = ("name",)
FLOW_KEY = ("fairness_id", "priority", "inference_pool", *MODEL)
PLUGIN = ("plugin_name", "plugin_type")
DECISION = ("plugin_name", "plugin_type", "model_name", "decision_type")


@dataclass(frozen=True, slots=True)
class Family:
    name: str  # as exposed; a counter's ends in _total
    kind: str  # COUNTER, GAUGE or HISTOGRAM
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()
    origin: str = OURS  # whose name it is: GIE, llm-d, both, or Ray EPP
    view_of: str | None = None  # rendered from this family's samples
    view_labels: tuple[str, ...] | None = None  # the source label each of ours is read from (default: same name)
    where: tuple[tuple[str, str], ...] = ()  # only the source's samples with these label values
    exposed: bool = True


def _view(name: str, source: str, help_text: str, labels: tuple[str, ...], origin: str = GIE_LLMD, **kw) -> Family:
    src = _BY_NAME[source]
    fam = Family(name, src.kind, help_text, labels, kw.pop("buckets", src.buckets), origin, source, **kw)
    return fam


_BY_NAME: dict[str, Family] = {}


def _add(*families: Family) -> None:
    for fam in families:
        if fam.name in _BY_NAME:
            raise ValueError(f"metric family {fam.name} defined twice")
        _BY_NAME[fam.name] = fam


# ---- per request, recorded by the gateway (serve_app/gateway/request_metrics.py) ---------------------------
_add(
    Family("llm_d_epp_request_total", COUNTER, "Requests the gateway parsed.", MODEL_FLOW, origin=LLMD),
    Family(
        "llm_d_epp_request_error_total",
        COUNTER,
        "Requests that ended in an error, by error code.",
        (*MODEL_FLOW, "error_code"),
        origin=LLMD,
    ),
    Family(
        "llm_d_epp_request_duration_seconds",
        HISTOGRAM,
        "Request latency, arrival to the response's end.",
        MODEL_FLOW,
        GENERAL_LATENCY,
        LLMD,
    ),
    Family("llm_d_epp_request_size_bytes", HISTOGRAM, "Request body size in bytes.", MODEL_FLOW, REQUEST_BYTES, LLMD),
    Family(
        "llm_d_epp_response_size_bytes",
        HISTOGRAM,
        "Response body size in bytes, as relayed.",
        MODEL_FLOW,
        RESPONSE_BYTES,
        LLMD,
    ),
    Family(
        "llm_d_epp_request_input_tokens",
        HISTOGRAM,
        "Prompt tokens per request (the response's usage).",
        MODEL_FLOW,
        PROMPT_TOKENS,
        LLMD,
    ),
    Family(
        "llm_d_epp_request_output_tokens",
        HISTOGRAM,
        "Completion tokens per request (the response's usage).",
        MODEL_FLOW,
        OUTPUT_TOKENS,
        LLMD,
    ),
    Family(
        "llm_d_epp_request_cached_tokens",
        HISTOGRAM,
        "Prompt tokens the model server read from its cache (usage.prompt_tokens_details.cached_tokens).",
        MODEL_FLOW,
        PROMPT_TOKENS,
        LLMD,
    ),
    Family(
        "llm_d_epp_request_running", GAUGE, "Requests whose response is being relayed now.", MODEL_FLOW, origin=LLMD
    ),
    Family(
        "llm_d_epp_request_ntpot_seconds",
        HISTOGRAM,
        "Request latency divided by its completion tokens.",
        MODEL_FLOW,
        NTPOT,
        LLMD,
    ),
    Family(
        "ray_epp_request_ttft_seconds",
        HISTOGRAM,
        "Time to first token (recorded for the views below).",
        (*MODEL_FLOW, "streaming"),
        GENERAL_LATENCY,
        exposed=False,
    ),
    Family(
        "ray_epp_request_tpot_seconds",
        HISTOGRAM,
        "Time per output token of a stream (recorded for the views below).",
        MODEL_FLOW,
        TPOT,
        exposed=False,
    ),
    Family(
        "llm_d_epp_request_streaming_itl_seconds",
        HISTOGRAM,
        "Time between consecutive chunks of a streamed response.",
        MODEL_FLOW,
        LLMD_ITL,
        LLMD,
    ),
    Family(
        "llm_d_epp_request_processing_duration_seconds",
        HISTOGRAM,
        "Arrival to the routing decision (body read, admission and queueing, scheduling), or to the refusal.",
        (),
        REQUEST_PROCESSING,
        LLMD,
    ),
    Family(
        "llm_d_epp_response_processing_duration_seconds",
        HISTOGRAM,
        "The gateway's own time on a response: per chunk for a stream, headers to end for a whole body.",
        (),
        RESPONSE_PROCESSING,
        LLMD,
    ),
)
_add(
    _view(
        "llm_d_epp_request_ttft_seconds",
        "ray_epp_request_ttft_seconds",
        "Time to first token: arrival to the first response chunk (a whole body: its arrival).",
        (*MODEL_FLOW, "streaming"),
        LLMD,
        buckets=LLMD_TTFT,
    ),
    _view(
        "llm_d_epp_request_streaming_tpot_seconds",
        "ray_epp_request_tpot_seconds",
        "Time per output token of a stream: (duration - TTFT) / (completion tokens - 1).",
        MODEL_FLOW,
        LLMD,
        buckets=LLMD_STREAMING_TPOT,
    ),
    _view(
        "inference_objective_request_total",
        "llm_d_epp_request_total",
        "Requests, per model and priority.",
        (*MODEL, "priority"),
    ),
    _view(
        "inference_objective_request_error_total",
        "llm_d_epp_request_error_total",
        "Request errors, per model and error code.",
        (*MODEL, "error_code"),
    ),
    _view(
        "inference_objective_request_duration_seconds",
        "llm_d_epp_request_duration_seconds",
        "Request latency, arrival to the response's end.",
        MODEL,
    ),
    _view(
        "inference_objective_request_ttft_seconds",
        "ray_epp_request_ttft_seconds",
        "Time to first token of streamed responses.",
        MODEL,
        where=(("streaming", "true"),),
    ),
    _view(
        "inference_objective_request_tpot_seconds",
        "ray_epp_request_tpot_seconds",
        "Time per output token of streamed responses.",
        MODEL,
    ),
    _view("inference_objective_request_sizes", "llm_d_epp_request_size_bytes", "Request body size in bytes.", MODEL),
    _view("inference_objective_response_sizes", "llm_d_epp_response_size_bytes", "Response body size in bytes.", MODEL),
    _view("inference_objective_input_tokens", "llm_d_epp_request_input_tokens", "Prompt tokens per request.", MODEL),
    _view(
        "inference_objective_output_tokens", "llm_d_epp_request_output_tokens", "Completion tokens per request.", MODEL
    ),
    _view(
        "inference_objective_prompt_cached_tokens",
        "llm_d_epp_request_cached_tokens",
        "Prompt tokens the model server read from its cache.",
        MODEL,
    ),
    _view(
        "inference_objective_running_requests",
        "llm_d_epp_request_running",
        "Requests whose response is being relayed now.",
        ("model_name",),
    ),
    _view(
        "inference_objective_normalized_time_per_output_token_seconds",
        "llm_d_epp_request_ntpot_seconds",
        "Request latency divided by its completion tokens.",
        MODEL,
    ),
)

# ---- scheduling ---------------------------------------------------------------------------------------
_add(
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
_add(
    _view(
        "inference_extension_scheduler_e2e_duration_seconds",
        "llm_d_epp_scheduler_e2e_duration_seconds",
        "Scheduling latency (every cycle of a request).",
        (),
    ),
    _view(
        "inference_extension_scheduler_attempts_total",
        "llm_d_epp_scheduler_attempts_total",
        "Scheduling attempts, by outcome and primary target.",
        ("status", "target_model_name", "pod_name", "namespace", "port"),
        view_labels=("status", "target_model_name", "endpoint_name", "namespace", "port"),
    ),
    _view(
        "llm_d_epp_plugin_duration_seconds",
        "inference_extension_plugin_duration_seconds",
        "Plugin latency, per extension point and plugin.",
        ("extension_point", "plugin_type", "plugin_name"),
        LLMD,
    ),
)

# ---- the prefix indexer (approx-prefix-cache-producer, in the profile actors) -----------------------------
_add(
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
_add(
    _view(
        "inference_extension_prefix_indexer_size", "llm_d_epp_prefix_indexer_size", "Entries in the prefix index.", ()
    ),
    _view(
        "inference_extension_prefix_indexer_hit_ratio",
        "llm_d_epp_prefix_indexer_hit_ratio",
        "Matched / total prompt blocks on the chosen endpoint.",
        (),
    ),
    _view(
        "inference_extension_prefix_indexer_hit_bytes",
        "llm_d_epp_prefix_indexer_hit_bytes",
        "Matched prompt length on the chosen endpoint, in bytes.",
        (),
    ),
)

# ---- the pool and the build, computed when /metrics is read (serve_app/gateway/metrics_page.py) ---------------
_add(
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
_add(
    _view(
        "inference_extension_info",
        "llm_d_epp_info",
        "The build: commit and version (build_ref).",
        ("commit", "build_ref"),
    ),
    _view(
        "inference_pool_average_kv_cache_utilization",
        "llm_d_epp_average_kv_cache_utilization",
        "Mean KV-cache use over the ready pods.",
        POOL,
    ),
    _view(
        "inference_pool_average_queue_size",
        "llm_d_epp_average_queue_size",
        "Mean waiting requests over the ready pods.",
        POOL,
    ),
    _view(
        "inference_pool_average_running_requests",
        "llm_d_epp_average_running_requests",
        "Mean running requests over the ready pods.",
        POOL,
    ),
    _view("inference_pool_ready_pods", "llm_d_epp_ready_endpoints", "Pods the datastore serves.", POOL),
    _view(
        "inference_pool_per_pod_queue_size",
        "llm_d_epp_per_endpoint_queue_size",
        "Waiting requests per ready pod.",
        ("name", "model_server_pod"),
        view_labels=("name", "model_server_endpoint"),
    ),
)

# ---- flow control (serve_app/gateway/flow_gate.py; saturation and capacity when /metrics is read) -----------------
_add(
    Family(
        "inference_extension_flow_control_request_queue_duration_seconds",
        HISTOGRAM,
        "Time in the flow-control queue, enqueue to outcome.",
        (*FLOW_KEY[:2], "outcome", *FLOW_KEY[2:]),
        FLOW_QUEUE,
        GIE_LLMD,
    ),
    Family(
        "inference_extension_flow_control_dispatch_cycle_duration_seconds",
        HISTOGRAM,
        "Duration of a dispatch pass over the flow-control queue.",
        (),
        SCHEDULER,
        GIE_LLMD,
    ),
    Family(
        "inference_extension_flow_control_request_enqueue_duration_seconds",
        HISTOGRAM,
        "Time to enqueue a request into the flow-control queue.",
        ("fairness_id", "priority", "outcome"),
        SCHEDULER,
        GIE_LLMD,
    ),
    Family(
        "inference_extension_flow_control_queue_size",
        GAUGE,
        "Requests in the flow-control queue.",
        FLOW_KEY,
        origin=GIE_LLMD,
    ),
    Family(
        "inference_extension_flow_control_queue_bytes",
        GAUGE,
        "Bytes of the requests in the flow-control queue.",
        FLOW_KEY,
        origin=GIE_LLMD,
    ),
    Family(
        "llm_d_epp_flow_control_pool_saturation",
        GAUGE,
        "Pool saturation as flow control's detectors see it (1.0: dispatch waits).",
        ("inference_pool", "stage"),
        origin=LLMD,
    ),
    Family(
        "llm_d_epp_flow_control_requests_total",
        COUNTER,
        "Requests that left the flow-control layer, by outcome.",
        ("outcome", "priority", "inference_pool"),
        origin=LLMD,
    ),
    Family(
        "llm_d_epp_flow_control_capacity_utilization_requests",
        GAUGE,
        "Requests queued in a priority band / the band's request capacity.",
        ("priority", "inference_pool"),
        origin=LLMD,
    ),
    Family(
        "llm_d_epp_flow_control_capacity_utilization_bytes",
        GAUGE,
        "Bytes queued in a priority band / the band's byte capacity.",
        ("priority", "inference_pool"),
        origin=LLMD,
    ),
    Family(
        "llm_d_epp_flow_control_global_capacity_utilization_requests",
        GAUGE,
        "Requests queued / the global request capacity (only when one is configured).",
        ("inference_pool",),
        origin=LLMD,
    ),
    Family(
        "llm_d_epp_flow_control_global_capacity_utilization_bytes",
        GAUGE,
        "Bytes queued / the global byte capacity (only when one is configured).",
        ("inference_pool",),
        origin=LLMD,
    ),
)
_add(
    *(
        _view(f"llm_d_epp_{base}", f"inference_extension_{base}", _BY_NAME[f"inference_extension_{base}"].help,
              _BY_NAME[f"inference_extension_{base}"].labels, LLMD)
        for base in (
            "flow_control_request_queue_duration_seconds", "flow_control_dispatch_cycle_duration_seconds",
            "flow_control_request_enqueue_duration_seconds", "flow_control_queue_size", "flow_control_queue_bytes",
        )
    ),
    _view(
        "inference_extension_flow_control_pool_saturation", "llm_d_epp_flow_control_pool_saturation",
        "Pool saturation as flow control's detectors see it.", ("inference_pool", "stage"),
    ),
)  # fmt: skip
# program-aware-fairness's own gauges: the answering replica's policy, read when /metrics is read.
_add(
    Family(
        "llm_d_epp_program_aware_jains_fairness_index",
        GAUGE,
        "Jain's fairness index of the mean queue wait over the active programs.",
        origin=LLMD,
    ),
    Family(
        "llm_d_epp_program_aware_avg_wait_time_milliseconds",
        GAUGE,
        "Mean queue wait per program, in ms.",
        ("program_id",),
        origin=LLMD,
    ),
    Family(
        "llm_d_epp_program_aware_attained_service_tokens",
        GAUGE,
        "Decayed tokens served per program.",
        ("program_id",),
        origin=LLMD,
    ),
)

# ---- P/D disaggregation (the gateway, from the handler's decision) ------------------------------------
_add(
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
_add(
    _view(
        "llm_d_inference_scheduler_disagg_decision_total",
        "llm_d_epp_disagg_decision_total",
        "disagg-profile-handler decisions, by stages used.",
        ("model_name", "decision_type"),
        LLMD,
    ),
    _view(
        "llm_d_inference_scheduler_pd_decision_total",
        "llm_d_epp_pd_decision_total",
        "pd-profile-handler decisions.",
        ("model_name", "decision_type"),
        LLMD,
    ),
)

# ---- the data layer: the metrics actors' scrapes, counted by the datastore -------------------------------
_add(
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
_add(
    _view(
        "llm_d_inference_scheduler_datalayer_poll_errors_total",
        "llm_d_epp_datalayer_poll_errors_total",
        "Failed scrapes of model servers' metrics pages.",
        ("source_type",),
        LLMD,
    ),
    _view(
        "llm_d_inference_scheduler_datalayer_extract_errors_total",
        "llm_d_epp_datalayer_extract_errors_total",
        "Metrics pages that could not be read as metrics.",
        ("source_type", "extractor_type"),
        LLMD,
    ),
)

# ---- KV events (the profile actors' subscribers) ------------------------------------------------------
_add(
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

# ---- Ray EPP's own ---------------------------------------------------------------------------------------
_add(
    Family(
        "ray_epp_profile_actor_round_trip_seconds",
        HISTOGRAM,
        "A gateway replica's batch to a profile actor (shard), sent to answered.",
        ("profile", "shard", "transport"),
        ROUND_TRIP,
    ),
    Family(
        "ray_epp_profile_actor_calls_total",
        COUNTER,
        "Scheduling calls sent to a profile actor (shard).",
        ("profile", "shard"),
    ),
    Family(
        "ray_epp_profile_actor_failures_total",
        COUNTER,
        "Batches a profile actor (shard) did not answer (dead, restarting past the bound, frozen).",
        ("profile", "shard"),
    ),
    Family(
        "ray_epp_profile_actor_failovers_total",
        COUNTER,
        "Batches whose calls a gateway replica sent again to the standby of a gone profile actor (shard).",
        ("profile", "shard"),
    ),
    Family(
        "ray_epp_gateway_in_flight_requests",
        GAUGE,
        "Requests the gateway replicas are serving, against their max_in_flight.",
    ),
    Family(
        "ray_epp_gateway_snapshot_age_seconds",
        GAUGE,
        "Since the answering replica's view of the pool last took a new datastore version.",
    ),
    Family(
        "ray_epp_pod_report_age_seconds",
        GAUGE,
        "Since the pod's metrics actor last reported a successful scrape.",
        ("pod",),
    ),
    Family("ray_epp_pod_state", GAUGE, "1 for the pod's state in the datastore.", ("pod", "state")),
    Family(
        "ray_epp_kv_events_subscriber_state",
        GAUGE,
        "1 for the state of a profile actor's subscription to a pod.",
        ("profile", "pod", "state"),
    ),
    Family("ray_epp_kv_events_gaps_total", COUNTER, "Sequence gaps in a pod's KV-event stream.", ("profile", "pod")),
    Family("ray_epp_kv_events_lost_total", COUNTER, "KV-event batches a replay could not recover.", ("profile", "pod")),
    Family(
        "ray_epp_pd_handoffs_total",
        COUNTER,
        "The gateway's P/D hand-offs by outcome: pd, decode-only, pd-fallback (prefill failed, decoded alone), failed.",
        ("outcome",),
    ),
)

FAMILIES: dict[str, Family] = dict(_BY_NAME)
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
