"""GIE's and llm-d's metric families on a real gateway's /metrics: a Ray Serve gateway, real actors
(one profile in two shards, with the approximate prefix index and a KV-event subscriber), flow
control on, three simulated vLLM pods on 127.0.0.1 that publish KV events. Requests of every kind
(completions and chat, streamed and not) go through it; the page is parsed with
prometheus_client's parser and held against the families as GIE and llm-d define them (transcribed
below from gateway-api-inference-extension pkg/epp/metrics at 1748e829 and llm-d-router at
ebab6879: names, types, label names, bucket boundaries), and its values against what was sent and
received."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.serve_app.deployments import E2ESetup, pod_specs, wait_until

pytestmark = pytest.mark.ray

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
SHARED = "You are a careful assistant. Read the whole report below and answer the question at its end. " * 8

CONFIG = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
featureGates: [flowControl]
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: precise-prefix-cache-producer
- name: precise-scorer
  type: prefix-cache-scorer
  parameters: {prefixMatchInfoProducerName: precise-prefix-cache-producer}
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
  - pluginRef: kv-cache-utilization-scorer
  - pluginRef: prefix-cache-scorer
    weight: 3
  - pluginRef: precise-scorer
"""

# ---- the families as GIE and llm-d define them ------------------------------------------------------
GENERAL = (0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 45,
           60, 120, 180, 240, 300, 360, 480, 600, 900, 1200, 1800, 2700, 3600)  # fmt: skip
TPOT = (0.0005, 0.00205, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.125, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1,
        1.5, 2, 3, 4.5, 6, 12, 18, 24, 30, 36, 48, 60, 90, 120, 180, 270, 360)  # fmt: skip
SCHED = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)
REQ_BYTES = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144, 524288, 1048576,
             2097152, 4194304, 8388608, 16777216, 33554432, 67108864, 134217728, 268435456, 536870912,
             1073741824)  # fmt: skip
RESP_BYTES = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32778, 65536)
IN_TOKENS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32778, 65536, 131072, 262144,
             524288, 1048576)  # fmt: skip
OUT_TOKENS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
NTPOT = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)
QUEUE = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
RATIO = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
HIT_BYTES = (0, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
M = ("model_name", "target_model_name")
MF = (*M, "fairness_id", "priority")
FLOW = ("fairness_id", "priority", "inference_pool", *M)
PLUGIN = ("plugin_name", "plugin_type")

# name -> (type, label names, buckets)
REFERENCE: dict[str, tuple[str, tuple[str, ...], tuple[float, ...]]] = {
    # GIE's names (llm-d exports them too)
    "inference_objective_request_total": ("counter", (*M, "priority"), ()),
    "inference_objective_request_error_total": ("counter", (*M, "error_code"), ()),
    "inference_objective_request_duration_seconds": ("histogram", M, GENERAL),
    "inference_objective_request_ttft_seconds": ("histogram", M, GENERAL),
    "inference_objective_request_tpot_seconds": ("histogram", M, TPOT),
    "inference_objective_request_sizes": ("histogram", M, REQ_BYTES),
    "inference_objective_response_sizes": ("histogram", M, RESP_BYTES),
    "inference_objective_input_tokens": ("histogram", M, IN_TOKENS),
    "inference_objective_output_tokens": ("histogram", M, OUT_TOKENS),
    "inference_objective_prompt_cached_tokens": ("histogram", M, IN_TOKENS),
    "inference_objective_running_requests": ("gauge", ("model_name",), ()),
    "inference_objective_normalized_time_per_output_token_seconds": ("histogram", M, NTPOT),
    "inference_pool_average_kv_cache_utilization": ("gauge", ("name",), ()),
    "inference_pool_average_queue_size": ("gauge", ("name",), ()),
    "inference_pool_average_running_requests": ("gauge", ("name",), ()),
    "inference_pool_ready_pods": ("gauge", ("name",), ()),
    "inference_pool_per_pod_queue_size": ("gauge", ("name", "model_server_pod"), ()),
    "inference_extension_scheduler_e2e_duration_seconds": ("histogram", (), SCHED),
    "inference_extension_scheduler_attempts_total": (
        "counter", ("status", "target_model_name", "pod_name", "namespace", "port"), (),
    ),
    "inference_extension_plugin_duration_seconds": ("histogram", ("extension_point", *PLUGIN[::-1]), SCHED),
    "inference_extension_prefix_indexer_size": ("gauge", (), ()),
    "inference_extension_prefix_indexer_hit_ratio": ("histogram", (), RATIO),
    "inference_extension_prefix_indexer_hit_bytes": ("histogram", (), HIT_BYTES),
    "inference_extension_info": ("gauge", ("commit", "build_ref"), ()),
    "inference_extension_flow_control_request_queue_duration_seconds": (
        "histogram", ("fairness_id", "priority", "outcome", "inference_pool", *M), QUEUE,
    ),
    "inference_extension_flow_control_dispatch_cycle_duration_seconds": ("histogram", (), SCHED),
    "inference_extension_flow_control_request_enqueue_duration_seconds": (
        "histogram", ("fairness_id", "priority", "outcome"), SCHED,
    ),
    "inference_extension_flow_control_queue_size": ("gauge", FLOW, ()),
    "inference_extension_flow_control_queue_bytes": ("gauge", FLOW, ()),
    "inference_extension_flow_control_pool_saturation": ("gauge", ("inference_pool", "stage"), ()),
    "llm_d_inference_scheduler_datalayer_poll_errors_total": ("counter", ("source_type",), ()),
    "llm_d_inference_scheduler_datalayer_extract_errors_total": ("counter", ("source_type", "extractor_type"), ()),
    "llm_d_inference_scheduler_disagg_decision_total": ("counter", ("model_name", "decision_type"), ()),
    "llm_d_inference_scheduler_pd_decision_total": ("counter", ("model_name", "decision_type"), ()),
    # llm-d's llm_d_epp_ names
    "llm_d_epp_request_total": ("counter", MF, ()),
    "llm_d_epp_request_error_total": ("counter", (*MF, "error_code"), ()),
    "llm_d_epp_request_duration_seconds": ("histogram", MF, GENERAL),
    "llm_d_epp_request_size_bytes": ("histogram", MF, REQ_BYTES),
    "llm_d_epp_response_size_bytes": ("histogram", MF, RESP_BYTES),
    "llm_d_epp_request_input_tokens": ("histogram", MF, IN_TOKENS),
    "llm_d_epp_request_output_tokens": ("histogram", MF, OUT_TOKENS),
    "llm_d_epp_request_cached_tokens": ("histogram", MF, IN_TOKENS),
    "llm_d_epp_request_running": ("gauge", MF, ()),
    "llm_d_epp_request_ntpot_seconds": ("histogram", MF, NTPOT),
    "llm_d_epp_request_ttft_seconds": ("histogram", (*MF, "streaming"), GENERAL[:24]),
    "llm_d_epp_request_streaming_tpot_seconds": (
        "histogram", MF, (0.0005, 0.00205, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.125, 0.15, 0.2, 0.3, 0.4,
                          0.5, 0.6, 0.8, 1, 2),
    ),
    "llm_d_epp_request_streaming_itl_seconds": (
        "histogram", MF, (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 2),
    ),
    "llm_d_epp_average_kv_cache_utilization": ("gauge", ("name",), ()),
    "llm_d_epp_average_queue_size": ("gauge", ("name",), ()),
    "llm_d_epp_average_running_requests": ("gauge", ("name",), ()),
    "llm_d_epp_std_dev_kv_cache_utilization": ("gauge", ("name",), ()),
    "llm_d_epp_std_dev_queue_size": ("gauge", ("name",), ()),
    "llm_d_epp_std_dev_running_requests": ("gauge", ("name",), ()),
    "llm_d_epp_ready_endpoints": ("gauge", ("name",), ()),
    "llm_d_epp_per_endpoint_queue_size": ("gauge", ("name", "model_server_endpoint"), ()),
    "llm_d_epp_scheduler_e2e_duration_seconds": ("histogram", (), SCHED),
    "llm_d_epp_scheduler_attempts_total": (
        "counter", ("status", "target_model_name", "endpoint_name", "namespace", "port"), (),
    ),
    "llm_d_epp_plugin_duration_seconds": ("histogram", ("extension_point", *PLUGIN[::-1]), SCHED),
    "llm_d_epp_request_processing_duration_seconds": (
        "histogram", (), (0.0005, 0.001, 0.002, 0.005, 0.01, 0.015, 0.025, 0.04, 0.06, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    ),
    "llm_d_epp_response_processing_duration_seconds": (
        "histogram", (), (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
    ),
    "llm_d_epp_info": ("gauge", ("commit", "build_ref"), ()),
    "llm_d_epp_flow_control_request_queue_duration_seconds": (
        "histogram", ("fairness_id", "priority", "outcome", "inference_pool", *M), QUEUE,
    ),
    "llm_d_epp_flow_control_dispatch_cycle_duration_seconds": ("histogram", (), SCHED),
    "llm_d_epp_flow_control_request_enqueue_duration_seconds": (
        "histogram", ("fairness_id", "priority", "outcome"), SCHED,
    ),
    "llm_d_epp_flow_control_queue_size": ("gauge", FLOW, ()),
    "llm_d_epp_flow_control_queue_bytes": ("gauge", FLOW, ()),
    "llm_d_epp_flow_control_pool_saturation": ("gauge", ("inference_pool", "stage"), ()),
    "llm_d_epp_flow_control_capacity_utilization_requests": ("gauge", ("priority", "inference_pool"), ()),
    "llm_d_epp_flow_control_capacity_utilization_bytes": ("gauge", ("priority", "inference_pool"), ()),
    "llm_d_epp_flow_control_global_capacity_utilization_requests": ("gauge", ("inference_pool",), ()),
    "llm_d_epp_flow_control_global_capacity_utilization_bytes": ("gauge", ("inference_pool",), ()),
    "llm_d_epp_flow_control_requests_total": ("counter", ("outcome", "priority", "inference_pool"), ()),
    "llm_d_epp_datalayer_poll_errors_total": ("counter", ("source_type",), ()),
    "llm_d_epp_datalayer_extract_errors_total": ("counter", ("source_type", "extractor_type"), ()),
    "llm_d_epp_prefix_indexer_size": ("gauge", PLUGIN, ()),
    "llm_d_epp_prefix_indexer_hit_ratio": ("histogram", PLUGIN, RATIO),
    "llm_d_epp_prefix_indexer_hit_bytes": ("histogram", PLUGIN, HIT_BYTES),
    "llm_d_epp_pd_decision_total": ("counter", ("plugin_name", "plugin_type", "model_name", "decision_type"), ()),
    "llm_d_epp_disagg_decision_total": ("counter", ("plugin_name", "plugin_type", "model_name", "decision_type"), ()),
    "llm_d_epp_program_aware_jains_fairness_index": ("gauge", (), ()),
    "llm_d_epp_program_aware_avg_wait_time_milliseconds": ("gauge", ("program_id",), ()),
    "llm_d_epp_program_aware_attained_service_tokens": ("gauge", ("program_id",), ()),
    "llm_d_epp_kv_cache_events_active_subscribers": ("gauge", (), ()),
    "llm_d_epp_kv_cache_events_messages_received_total": ("counter", ("pod_identifier",), ()),
    "llm_d_epp_kv_cache_events_pool_queue_depth": ("gauge", (), ()),
}  # fmt: skip


# CONFIG with its profile in two shards, on three pods that publish KV events;
# test_dashboard_prometheus.py runs its Prometheus against the same deployment.
E2E_SETUP = E2ESetup(pods=3, seed=3, pod_overrides={"max_num_seqs": 8, "kv_events": True}, config=CONFIG,
                     spec={"profile_shards": 2})  # fmt: skip


def test_the_pods_file_lists_each_pods_kv_event_addresses(sim):
    """As `epp sim` lists them: the deployment's KV-event subscriber reads them from there."""
    assert all(p.labels.get("kv-events.ray-epp.io/endpoint") for p in pod_specs(sim))


def page(client: httpx.Client) -> dict[str, object]:
    """The /metrics page's families by their exposed name (a counter's with its _total)."""
    text = client.get("/metrics").text
    out = {}
    for fam in text_string_to_metric_families(text):
        out[fam.name + ("_total" if fam.type == "counter" else "")] = fam
    return out


def total(fams, family: str, suffix: str = "", **labels: str) -> float:
    """The sum of a family's samples (`suffix` "_sum" / "_count" for a histogram) matching `labels`."""
    fam = fams[family]
    sample_name = family + suffix if suffix else (family if fam.type != "histogram" else family + "_count")
    return sum(
        s.value for s in fam.samples if s.name == sample_name and all(s.labels.get(k) == v for k, v in labels.items())
    )




class Traffic:
    """Requests of every kind through the gateway, and what was sent and received."""

    def __init__(self) -> None:
        self.sent_bytes = self.received_bytes = 0
        self.prompt_tokens = self.completion_tokens = self.cached_tokens = 0
        self.n = self.streamed = self.multi_token_streams = 0
        self.ntpot_bound = 0.0  # the sum of client-side duration / completion tokens

    def send(self, client: httpx.Client, path: str, body: dict) -> None:
        raw = json.dumps(body).encode()
        started = time.perf_counter()
        headers = {"content-type": "application/json"}
        with client.stream("POST", path, content=raw, headers=headers) as resp:
            assert resp.status_code == 200, resp.read()
            chunks = list(resp.iter_raw())
        elapsed = time.perf_counter() - started
        data = b"".join(chunks)
        self.n += 1
        self.sent_bytes += len(raw)
        self.received_bytes += len(data)
        if body.get("stream"):
            self.streamed += 1
            events = [json.loads(line[5:]) for line in data.splitlines() if line.startswith(b"data: {")]
            usage = next(e["usage"] for e in reversed(events) if e.get("usage"))
            self.multi_token_streams += usage["completion_tokens"] > 1
        else:
            usage = json.loads(data)["usage"]
        self.prompt_tokens += usage["prompt_tokens"]
        self.completion_tokens += usage["completion_tokens"]
        self.cached_tokens += usage["prompt_tokens_details"]["cached_tokens"]
        self.ntpot_bound += elapsed / usage["completion_tokens"]


@pytest.fixture(scope="module")
def traffic(gateway):
    """24 requests: completions and chat, streamed (with usage) and not, half of them sharing a
    long prefix; and the page before and after they are all in."""
    t = Traffic()
    with httpx.Client(base_url=gateway.url, timeout=60) as client:
        wait_until(lambda: client.get("/ready").status_code == 200, timeout_s=20, every_s=0.25)
        before = page(client)
        for i in range(6):
            # every prompt at least a block long (the index's hit ratio needs one)
            prompt = SHARED if i % 2 else f"A question of its own, number {i}, about nothing much at all, really. "
            prompt += f"Q{i}?"
            options = {"max_tokens": 6 + i}
            usage = {"stream_options": {"include_usage": True}}
            chat = {"messages": [{"role": "user", "content": prompt}]}
            t.send(client, "/v1/completions", {"model": MODEL, "prompt": prompt, **options})
            t.send(client, "/v1/completions", {"model": MODEL, "prompt": prompt, "stream": True, **usage, **options})
            t.send(client, "/v1/chat/completions", {"model": MODEL, **chat, **options})
            t.send(client, "/v1/chat/completions", {"model": MODEL, **chat, "stream": True, **usage, **options})

        def settled():
            fams = page(client)
            hits = "llm_d_epp_prefix_indexer_hit_bytes"  # the profile actors push once a second
            pushed = total(fams, hits) - total(before, hits)
            return fams if pushed >= t.n and total(fams, "inference_objective_running_requests") == 0 else None

        after = wait_until(settled, timeout_s=20, every_s=0.25)
    return t, before, after


def delta(traffic, name: str, suffix: str = "", **labels: str) -> float:
    _, before, after = traffic
    return total(after, name, suffix, **labels) - (total(before, name, suffix, **labels) if name in before else 0.0)


# ---- the families: names, types, labels, buckets -------------------------------------------------------


def test_every_gie_and_llmd_family_is_on_the_page_as_they_define_it(traffic):
    _, _, fams = traffic
    for name, (kind, labels, buckets) in REFERENCE.items():
        assert name in fams, f"{name} is not on /metrics"
        fam = fams[name]
        assert fam.type == kind, (name, fam.type)
        bounds: dict[tuple, list[float]] = {}  # each histogram series' bucket bounds, in order
        for s in fam.samples:
            assert set(s.labels) - {"le"} == set(labels), (name, s.labels)
            if s.name.endswith("_bucket"):
                series = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
                bounds.setdefault(series, []).append(float(s.labels["le"]))
        for got in bounds.values():
            assert got == [*map(float, buckets), float("inf")], name


def test_every_catalogued_family_is_exported_and_the_catalogue_matches_them(traffic):
    """Every family Ray EPP defines is on the page; the catalogue holds GIE's and llm-d's as they
    define them (also those this traffic leaves without samples: P/D decisions, fairness gauges)."""
    from actors.metric_families import FAMILIES

    _, _, fams = traffic
    for fam in FAMILIES.values():
        if fam.exposed:
            assert fam.name in fams, fam.name
    for name, (kind, labels, buckets) in REFERENCE.items():
        fam = FAMILIES[name]
        ours = (fam.kind, fam.labels, tuple(map(float, fam.buckets)))
        assert ours == (kind, labels, tuple(map(float, buckets))), name


def test_the_families_the_dashboards_missed_are_fed(traffic):
    """The nine families that were absent (request and response sizes, tokens, normalised TPOT,
    the prefix indexer's three, the build info) now have samples."""
    _, _, fams = traffic
    for name in (
        "inference_objective_request_sizes",
        "inference_objective_response_sizes",
        "inference_objective_input_tokens",
        "inference_objective_output_tokens",
        "inference_objective_normalized_time_per_output_token_seconds",
        "inference_extension_prefix_indexer_size",
        "inference_extension_prefix_indexer_hit_ratio",
        "inference_extension_prefix_indexer_hit_bytes",
        "inference_extension_info",
    ):
        assert fams[name].samples, name
    import ray_epp

    assert total(fams, "inference_extension_info", build_ref=ray_epp.__version__) == 1.0
    assert total(fams, "llm_d_epp_info", build_ref=ray_epp.__version__) == 1.0


# ---- the values -----------------------------------------------------------------------------------------


def test_sizes_are_the_bytes_sent_and_received(traffic):
    t, _, _ = traffic
    for name in ("inference_objective_request_sizes", "llm_d_epp_request_size_bytes"):
        assert delta(traffic, name) == t.n
        assert delta(traffic, name, "_sum") == t.sent_bytes
    for name in ("inference_objective_response_sizes", "llm_d_epp_response_size_bytes"):
        assert delta(traffic, name) == t.n
        assert delta(traffic, name, "_sum") == t.received_bytes


def test_tokens_are_the_responses_usage(traffic):
    t, _, _ = traffic
    assert delta(traffic, "inference_objective_input_tokens", "_sum") == t.prompt_tokens
    assert delta(traffic, "inference_objective_output_tokens", "_sum") == t.completion_tokens
    assert delta(traffic, "inference_objective_prompt_cached_tokens", "_sum") == t.cached_tokens
    assert delta(traffic, "llm_d_epp_request_output_tokens", "_sum") == t.completion_tokens
    for name in ("inference_objective_input_tokens", "inference_objective_output_tokens"):
        assert delta(traffic, name) == t.n
    ntpot = delta(traffic, "inference_objective_normalized_time_per_output_token_seconds", "_sum")
    assert delta(traffic, "inference_objective_normalized_time_per_output_token_seconds") == t.n
    assert 0 < ntpot <= t.ntpot_bound  # the gateway's own clock runs inside the client's


def test_latencies_count_each_request_once_by_kind(traffic):
    t, _, _ = traffic
    assert delta(traffic, "inference_objective_request_total") == t.n
    assert delta(traffic, "llm_d_epp_request_total") == t.n
    assert delta(traffic, "inference_objective_request_duration_seconds") == t.n
    assert delta(traffic, "inference_objective_request_ttft_seconds") == t.streamed  # GIE's: streams only
    assert delta(traffic, "llm_d_epp_request_ttft_seconds", streaming="true") == t.streamed
    assert delta(traffic, "llm_d_epp_request_ttft_seconds", streaming="false") == t.n - t.streamed
    assert delta(traffic, "inference_objective_request_tpot_seconds") == t.multi_token_streams
    assert delta(traffic, "llm_d_epp_request_streaming_tpot_seconds") == t.multi_token_streams
    assert delta(traffic, "llm_d_epp_request_streaming_itl_seconds") > 0
    assert delta(traffic, "llm_d_epp_request_processing_duration_seconds") == t.n
    assert delta(traffic, "llm_d_epp_response_processing_duration_seconds") == t.n
    _, _, fams = traffic
    assert total(fams, "inference_objective_running_requests") == 0
    assert total(fams, "ray_epp_gateway_in_flight_requests") == 0


def test_scheduling_attempts_name_the_pods_that_served(traffic, sim):
    _, _, fams = traffic
    ports = {p.name: str(p.port) for p in sim.pods}
    assert delta(traffic, "inference_extension_scheduler_attempts_total", status="success") >= traffic[0].n
    for s in fams["inference_extension_scheduler_attempts_total"].samples:
        if s.labels["status"] == "success":
            assert ports[s.labels["pod_name"]] == s.labels["port"]
            assert s.labels["target_model_name"] == MODEL
    assert delta(traffic, "inference_extension_scheduler_e2e_duration_seconds") >= traffic[0].n
    assert delta(traffic, "llm_d_epp_scheduler_e2e_duration_seconds") >= traffic[0].n


def test_the_prefix_index_reports_its_size_and_hits(traffic):
    t, _, fams = traffic
    assert total(fams, "inference_extension_prefix_indexer_size") > 0
    labels = {"plugin_name": "prefix-cache-scorer", "plugin_type": "approx-prefix-cache-producer"}
    assert total(fams, "llm_d_epp_prefix_indexer_size", **labels) > 0
    assert delta(traffic, "inference_extension_prefix_indexer_hit_ratio") == t.n
    assert delta(traffic, "inference_extension_prefix_indexer_hit_bytes") == t.n
    assert delta(traffic, "inference_extension_prefix_indexer_hit_bytes", "_sum") > 0  # the shared prefix hit


def test_the_pool_gauges_and_the_datastore_figures(traffic, sim):
    _, _, fams = traffic
    assert total(fams, "inference_pool_ready_pods", name="default") == len(sim.pods)
    assert {s.labels["model_server_pod"] for s in fams["inference_pool_per_pod_queue_size"].samples} == {
        p.name for p in sim.pods
    }
    for p in sim.pods:
        assert total(fams, "ray_epp_pod_state", pod=p.name, state="ready") == 1.0
        assert 0 <= total(fams, "ray_epp_pod_report_age_seconds", pod=p.name) < 5
    assert 0 <= total(fams, "ray_epp_gateway_snapshot_age_seconds") < 5
    assert total(fams, "llm_d_epp_datalayer_poll_errors_total", source_type="metrics-data-source") == 0


def test_flow_control_counts_every_request(traffic):
    t, _, fams = traffic
    assert delta(traffic, "llm_d_epp_flow_control_requests_total", outcome="Dispatched") == t.n
    assert delta(traffic, "inference_extension_flow_control_request_enqueue_duration_seconds") == t.n
    assert delta(traffic, "inference_extension_flow_control_request_queue_duration_seconds") == t.n
    assert delta(traffic, "inference_extension_flow_control_dispatch_cycle_duration_seconds") >= t.n
    assert fams["inference_extension_flow_control_pool_saturation"].samples
    assert total(fams, "llm_d_epp_flow_control_capacity_utilization_requests") == 0  # nothing queued now


def test_our_own_families_show_the_actors_and_the_kv_events(traffic, sim):
    t, _, fams = traffic
    calls = fams["ray_epp_profile_actor_calls_total"].samples
    assert {s.labels["shard"] for s in calls} <= {"0", "1"} and {s.labels["profile"] for s in calls} == {"default"}
    assert delta(traffic, "ray_epp_profile_actor_calls_total") == t.n
    assert delta(traffic, "ray_epp_profile_actor_round_trip_seconds") > 0
    assert {s.labels["transport"] for s in fams["ray_epp_profile_actor_round_trip_seconds"].samples} <= {
        "channel",
        "ray",
    }
    assert total(fams, "ray_epp_profile_actor_failures_total") == 0
    # each shard of the profile subscribes to each pod's KV events
    wait = {p.name: 2.0 for p in sim.pods}
    live = {
        s.labels["pod"]: s.value
        for s in fams["ray_epp_kv_events_subscriber_state"].samples
        if s.labels["state"] == "live"
    }
    assert live == wait
    assert total(fams, "llm_d_epp_kv_cache_events_active_subscribers") == 2 * len(sim.pods)
    assert total(fams, "llm_d_epp_kv_cache_events_messages_received_total") > 0
    assert total(fams, "ray_epp_kv_events_lost_total") == 0
