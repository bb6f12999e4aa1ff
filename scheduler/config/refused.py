"""llm-d plugin types Ray EPP knows but does not run, each with the reason a config using it is refused.

The list is llm-d/llm-d-router's registrations (cmd/epp/runner/runner.go `registerInTreePlugins`, at
ebab6879) minus what `scheduler.plugins` registers. The loader consults it only for a type no plugin
class claims: a plugin written later (e.g. a flow-control policy) takes over its entry by registering
under that type name, and tests/scheduler/test_llmd_refused.py checks no entry shadows a plugin."""

from __future__ import annotations

_TOKENIZER = (
    "it is llm-d's older tokenizer plugin; `token-producer` runs here (vLLM `/tokenize` or a local tokenizer.json)"
)
_TOKENS = (
    "it reads the token ids a `token-producer` writes; Ray EPP runs the token producer but not this consumer "
    "of its tokens"
)
_DCGM = "it reads GPU metrics from an NVIDIA DCGM exporter, which Ray EPP does not scrape"
_DATA_LAYER = (
    "Ray EPP's data layer is its metrics actors (`metrics-data-source` + `core-metrics-extractor`) and its "
    "profile actors' KV-event feeds (`endpoint-notification-source` for `precise-prefix-cache-producer`); "
    "other data-layer sources and extractors are not run here"
)
_DISCOVERY = "Ray EPP's pods come from its pods file and pod sources (`epp pods`), not a discovery plugin"
_FLOW_CONTROL = (
    "it is a flowControl policy Ray EPP's queue does not implement (it has fcfs-ordering-policy, "
    "edf-ordering-policy, slo-deadline-ordering-policy, global-strict-fairness-policy, round-robin-fairness-policy and "
    "program-aware-fairness)"
)
_PARSER = "Ray EPP's gateway parses OpenAI requests only (`openai-parser`)"
_MULTICLUSTER = "it federates EPPs across clusters, which Ray EPP does not do"
_K8S = "it watches Kubernetes objects (DisaggregatedSet rollouts), and Ray EPP runs without Kubernetes"
_TEST = "it is a plugin of llm-d's conformance tests, not for deployments"
_NOT_YET = "Ray EPP does not implement it yet"

REFUSED: dict[str, str] = {
    # Tokenizers and what depends on their tokens.
    "tokenizer": _TOKENIZER,
    "mm-embeddings-cache-producer": _TOKENS,
    "mm-embeddings-cache-scorer": "it scores the multimodal embeddings an `mm-embeddings-cache-producer` tracks, "
    "which Ray EPP does not run",
    "precise-prefix-cache-scorer": "it is llm-d's older combined form of `precise-prefix-cache-producer` + "
    "`prefix-cache-scorer`; write those two (the scorer with `prefixMatchInfoProducerName`)",
    # GPU telemetry and the configurable data layer.
    "dcgm-data-source": _DCGM,
    "dcgm-extractor": _DCGM,
    "k8s-notification-source": _DATA_LAYER,
    "models-data-source": _DATA_LAYER,
    "models-data-extractor": _DATA_LAYER,
    "p2p-source-producer": _DATA_LAYER,
    "cross-replica-publisher": _DATA_LAYER,
    "file-discovery": _DISCOVERY,
    # Flow control: the policies the queue does not implement (eviction, others).
    "sheddable-eviction-filter": _FLOW_CONTROL,
    "priority-then-time-eviction-order-policy": _FLOW_CONTROL,
    # Latency prediction.
    # Request parsing.
    "passthrough-parser": _PARSER,
    "anthropic-parser": _PARSER,
    "vllmgrpc-parser": _PARSER,
    "vllmhttp-parser": _PARSER,
    "sglanghttp-parser": _PARSER,
    "vertexai-parser": _PARSER,
    # Multi-cluster.
    "multicluster-file-discovery": _MULTICLUSTER,
    "multicluster-metrics-data-source": _MULTICLUSTER,
    "multicluster-metrics-extractor": _MULTICLUSTER,
    "multicluster-session-affinity-filter": _MULTICLUSTER,
    "multicluster-queue-scorer": _MULTICLUSTER,
    "multicluster-kv-cache-utilization-scorer": _MULTICLUSTER,
    "multicluster-prefix-cache-scorer": _MULTICLUSTER,
    "multicluster-approx-prefix-cache-producer": _MULTICLUSTER,
    # Kubernetes-bound and test-only plugins.
    "disaggregatedset-rollout-screener": _K8S,
    "disaggregatedset-rollout-pod-extractor": _K8S,
    "header-based-testing-filter": _TEST,
    "destination-endpoint-served-verifier": _TEST,
    # Deprecated in llm-d, with a replacement that runs here.
    "data-parallel-profile-handler": "it is deprecated in llm-d (replaced by `single-profile-handler`) and sends "
    "every request to `primaryPort` with an X-Data-Parallel-Endpoint header for an Istio sidecar to route; Ray "
    "EPP's gateway sends each request straight to the chosen rank's address, which is what llm-d's migration "
    "to `single-profile-handler` gives: use that",
    # Not implemented yet.
    "agent-identity": "it maps a request's agent identity header into request attributes; " + _NOT_YET,
    "request-attribute-reporter": "it reports request attributes back to the gateway as response metadata; " + _NOT_YET,
    "header-label-affinity-scorer": _NOT_YET,
    "session-id-producer": "it publishes a SessionID request attribute that no llm-d plugin reads at ebab6879, so "
    "accepting it would change nothing; session affinity here is `session-affinity-scorer` / `-filter` "
    "(`algorithm: session_id_header` reads the session header itself)",
    "endpoint-attribute-filter": "it filters on an attribute a data-layer extractor (e.g. `dcgm-extractor`) "
    "writes, and Ray EPP has no such extractor; " + _NOT_YET,
    "endpoint-attribute-scorer": "it scores an attribute a data-layer extractor (e.g. `dcgm-extractor`) "
    "writes, and Ray EPP has no such extractor; " + _NOT_YET,
}


def refusal(type_name: str) -> str | None:
    """Why an llm-d plugin type can not run here, or None if it is not a known llm-d type."""
    return REFUSED.get(type_name)
