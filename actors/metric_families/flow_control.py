"""Flow control families (serve_app/gateway/flow_gate.py; saturation and capacity computed when
/metrics is read)."""

from __future__ import annotations

from actors.metric_families.buckets import FLOW_QUEUE, SCHEDULER
from actors.metric_families.family import (
    COUNTER,
    FLOW_KEY,
    GAUGE,
    GIE_LLMD,
    HISTOGRAM,
    LLMD,
    REGISTERED,
    Family,
    add_families,
    view,
)

# ---- flow control (serve_app/gateway/flow_gate.py; saturation and capacity when /metrics is read) -----------------
add_families(
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
add_families(
    *(
        view(f"llm_d_epp_{base}", f"inference_extension_{base}", REGISTERED[f"inference_extension_{base}"].help,
              REGISTERED[f"inference_extension_{base}"].labels, LLMD)
        for base in (
            "flow_control_request_queue_duration_seconds", "flow_control_dispatch_cycle_duration_seconds",
            "flow_control_request_enqueue_duration_seconds", "flow_control_queue_size", "flow_control_queue_bytes",
        )
    ),
    view(
        "inference_extension_flow_control_pool_saturation", "llm_d_epp_flow_control_pool_saturation",
        "Pool saturation as flow control's detectors see it.", ("inference_pool", "stage"),
    ),
)  # fmt: skip
# program-aware-fairness's own gauges: the answering replica's policy, read when /metrics is read.
add_families(
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
