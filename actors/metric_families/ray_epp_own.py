"""Ray EPP's own families (`ray_epp_`): the health of the parts GIE and llm-d have no counterpart for
(profile actors, gateway replicas, pods' reports, KV-event subscriptions, P/D hand-offs)."""

from __future__ import annotations

from actors.metric_families.buckets import ROUND_TRIP
from actors.metric_families.family import COUNTER, GAUGE, HISTOGRAM, Family, add_families

# ---- Ray EPP's own ---------------------------------------------------------------------------------------
add_families(
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
