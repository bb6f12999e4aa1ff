"""Per-request families, recorded by the gateway (serve_app/gateway/request_metrics.py), and GIE's
names for them as views."""

from __future__ import annotations

from actors.metric_families.buckets import (
    GENERAL_LATENCY,
    LLMD_ITL,
    LLMD_STREAMING_TPOT,
    LLMD_TTFT,
    NTPOT,
    OUTPUT_TOKENS,
    PROMPT_TOKENS,
    REQUEST_BYTES,
    REQUEST_PROCESSING,
    RESPONSE_BYTES,
    RESPONSE_PROCESSING,
    TPOT,
)
from actors.metric_families.family import COUNTER, GAUGE, HISTOGRAM, LLMD, MODEL, MODEL_FLOW, Family, add_families, view

# ---- per request, recorded by the gateway (serve_app/gateway/request_metrics.py) ---------------------------
add_families(
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
add_families(
    view(
        "llm_d_epp_request_ttft_seconds",
        "ray_epp_request_ttft_seconds",
        "Time to first token: arrival to the first response chunk (a whole body: its arrival).",
        (*MODEL_FLOW, "streaming"),
        LLMD,
        buckets=LLMD_TTFT,
    ),
    view(
        "llm_d_epp_request_streaming_tpot_seconds",
        "ray_epp_request_tpot_seconds",
        "Time per output token of a stream: (duration - TTFT) / (completion tokens - 1).",
        MODEL_FLOW,
        LLMD,
        buckets=LLMD_STREAMING_TPOT,
    ),
    view(
        "inference_objective_request_total",
        "llm_d_epp_request_total",
        "Requests, per model and priority.",
        (*MODEL, "priority"),
    ),
    view(
        "inference_objective_request_error_total",
        "llm_d_epp_request_error_total",
        "Request errors, per model and error code.",
        (*MODEL, "error_code"),
    ),
    view(
        "inference_objective_request_duration_seconds",
        "llm_d_epp_request_duration_seconds",
        "Request latency, arrival to the response's end.",
        MODEL,
    ),
    view(
        "inference_objective_request_ttft_seconds",
        "ray_epp_request_ttft_seconds",
        "Time to first token of streamed responses.",
        MODEL,
        where=(("streaming", "true"),),
    ),
    view(
        "inference_objective_request_tpot_seconds",
        "ray_epp_request_tpot_seconds",
        "Time per output token of streamed responses.",
        MODEL,
    ),
    view("inference_objective_request_sizes", "llm_d_epp_request_size_bytes", "Request body size in bytes.", MODEL),
    view("inference_objective_response_sizes", "llm_d_epp_response_size_bytes", "Response body size in bytes.", MODEL),
    view("inference_objective_input_tokens", "llm_d_epp_request_input_tokens", "Prompt tokens per request.", MODEL),
    view(
        "inference_objective_output_tokens", "llm_d_epp_request_output_tokens", "Completion tokens per request.", MODEL
    ),
    view(
        "inference_objective_prompt_cached_tokens",
        "llm_d_epp_request_cached_tokens",
        "Prompt tokens the model server read from its cache.",
        MODEL,
    ),
    view(
        "inference_objective_running_requests",
        "llm_d_epp_request_running",
        "Requests whose response is being relayed now.",
        ("model_name",),
    ),
    view(
        "inference_objective_normalized_time_per_output_token_seconds",
        "llm_d_epp_request_ntpot_seconds",
        "Request latency divided by its completion tokens.",
        MODEL,
    ),
)
