"""No silent ignoring: llm-d's samples that can not run here (tests/fixtures/llm-d/refused, verbatim
from llm-d/llm-d-router deploy/config) fail at load time naming each plugin or field and why; every
plugin type llm-d registers is either run or refused with a reason; the sections llm-d defines are
accepted only where Ray EPP does what llm-d does with them; `epp validate` lists which is which."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler import Scheduler
from scheduler.admission import admission_detectors
from scheduler.config import load_config, load_config_file
from scheduler.config.refused import REFUSED
from scheduler.config.report import config_report
from scheduler.errors import ConfigError
from scheduler.registry import plugin_class, plugin_types

REFUSED_DIR = Path(__file__).parents[1] / "fixtures" / "llm-d" / "refused"

# llm-d/llm-d-router cmd/epp/runner/runner.go registerInTreePlugins at ebab6879: every type name.
LLMD_TYPES = """
active-request-scorer agent-identity always-disagg-multimodal-decider always-disagg-pd-decider anthropic-parser
approx-prefix-cache-producer burst-prefix-cache-producer by-label by-label-selector concurrency-detector
context-length-aware core-metrics-extractor cross-replica-publisher data-parallel-profile-handler dcgm-data-source
dcgm-extractor decode-filter destination-endpoint-served-verifier disagg-headers-handler disagg-profile-handler
disaggregatedset-rollout-pod-extractor disaggregatedset-rollout-screener edf-ordering-policy encode-filter
endpoint-attribute-filter endpoint-attribute-scorer endpoint-notification-source fcfs-ordering-policy file-discovery
global-strict-fairness-policy header-based-testing-filter header-label-affinity-scorer header-profile-handler
inflight-load-producer k8s-notification-source kv-cache-utilization-scorer label-selector-filter latency-scorer
latency-slo-admitter load-aware-scorer lora-affinity-scorer max-score-picker metrics-data-source
mm-embeddings-cache-producer mm-embeddings-cache-scorer models-data-extractor models-data-source
multicluster-approx-prefix-cache-producer multicluster-file-discovery multicluster-kv-cache-utilization-scorer
multicluster-metrics-data-source multicluster-metrics-extractor multicluster-prefix-cache-scorer
multicluster-queue-scorer multicluster-session-affinity-filter no-hit-lru-scorer openai-parser p2p-source-producer
passthrough-parser pd-profile-handler precise-prefix-cache-producer precise-prefix-cache-scorer
predicted-latency-producer prefill-filter prefill-header-handler prefix-based-pd-decider
prefix-cache-affinity-filter prefix-cache-scorer priority-holdback-policy priority-then-time-eviction-order-policy
probabilistic-admitter program-aware-fairness queue-scorer random-picker request-attribute-reporter
round-robin-fairness-policy running-requests-size-scorer session-affinity-filter session-affinity-scorer
session-id-producer sglanghttp-parser sheddable-eviction-filter single-profile-handler slo-deadline-ordering-policy
slo-headroom-tier-filter soft-reflective-ceiling-policy static-usage-limit-policy token-load-scorer token-producer
tokenizer topology-affinity-filter topology-affinity-scorer topology-extractor utilization-detector
utilization-filter vertexai-parser vllmgrpc-parser vllmhttp-parser weighted-random-picker
""".split()  # noqa: SIM905 (the names as a word list, easier to compare with llm-d)

# Each refused sample and what must be named as the reason (a plugin type or a section field).
REFUSED_SAMPLES = {
    "dp-epp-config.yaml": ["data-parallel-profile-handler"],
    "epp-mm-embeddings-cache-config.yaml": ["mm-embeddings-cache-producer", "dataLayer.sources"],
    "sim-epp-gpu-config.yaml": ["dcgm-data-source", "dcgm-extractor", "endpoint-attribute-filter"],
}


def test_every_llmd_type_runs_here_or_is_refused_with_a_reason():
    missing = [t for t in LLMD_TYPES if plugin_class(t) is None and t not in REFUSED]
    assert missing == []


def test_no_refusal_shadows_a_plugin_that_runs():
    assert sorted(set(REFUSED) & set(plugin_types())) == []


def test_every_refused_sample_is_a_fixture():
    assert sorted(f.name for f in REFUSED_DIR.glob("*.yaml")) == sorted(REFUSED_SAMPLES)


@pytest.mark.parametrize(("name", "named"), sorted(REFUSED_SAMPLES.items()))
def test_refused_samples_say_which_plugin_or_field_and_why(name, named):
    text = (REFUSED_DIR / name).read_text()
    assert text.startswith(f"# Source: github.com/llm-d/llm-d-router deploy/config/{name} at commit ")
    with pytest.raises(ConfigError) as err:
        load_config_file(REFUSED_DIR / name)
    message = str(err.value)
    assert "unknown plugin type" not in message
    for what in named:
        line = next((e for e in err.value.errors if what in e), None)
        assert line is not None, f"{what} not named in {message}"
        if "-" in what and " " not in what:  # a plugin type: llm-d's reason is given
            assert f"plugin type {what!r} is llm-d's, but can not run in Ray EPP: " in line


def test_a_type_nobody_knows_is_still_unknown():
    with pytest.raises(ConfigError, match="unknown plugin type 'no-such-plugin'"):
        load_config({"plugins": [{"type": "no-such-plugin"}]})


BASE = [{"type": "queue-scorer"}, {"type": "max-score-picker"}]


@pytest.mark.parametrize(
    ("extra", "expect"),
    [
        ({"featureGates": ["noSuchGate"]}, "featureGates[0] 'noSuchGate': unknown feature gate"),
        ({"dataLayer": {"injectDefaults": False}}, "dataLayer.injectDefaults: false can not be honoured"),
        ({"dataLayer": {"discovery": {"pluginRef": "x"}}}, "dataLayer.discovery: Ray EPP's pods come from"),
        ({"dataLayer": {"peerDiscovery": {"pluginRef": "x"}}}, "dataLayer.peerDiscovery: gateway replicas share"),
        ({"dataLayer": {"bogus": 1}}, "dataLayer.bogus: unknown field"),
        ({"flowControl": {"enableEviction": True}}, "flowControl.enableEviction: in-flight eviction is not"),
        ({"flowControl": {"saturationDetector": {"pluginRef": "nope"}}}, "names no plugin"),
        ({"flowControl": {"saturationDetector": {"pluginRef": "queue-scorer"}}}, "is not a saturation detector"),
        ({"saturationDetector": {"pluginRef": "queue-scorer"}}, "saturationDetector: plugin 'queue-scorer'"),
        ({"requestHandler": {"parsers": [{"pluginRef": "queue-scorer"}]}}, "is not a request parser"),
        ({"parser": {"pluginRef": "nope"}}, "parser: pluginRef 'nope' names no plugin"),
    ],
)
def test_sections_refuse_what_does_not_run_naming_the_field(extra, expect):
    with pytest.raises(ConfigError) as err:
        load_config({"plugins": BASE, **extra})
    assert any(expect in e for e in err.value.errors), err.value.errors


@pytest.mark.parametrize(
    "extra",
    [
        {"featureGates": ["haPopulateNonLeaderDatastore"]},
        {"dataLayer": {"injectDefaults": True}},
        {"requestHandler": {"parsers": [{"pluginRef": "openai-parser"}]}},
        {"parser": {"pluginRef": "openai-parser"}},
    ],
)
def test_sections_accept_what_ray_epp_does(extra):
    cfg = load_config({"plugins": [*BASE, {"type": "openai-parser"}], **extra})
    assert cfg.plugin_spec("openai-parser") is not None


@pytest.mark.parametrize("form", ["flowControl", "saturationDetector"])
def test_a_named_saturation_detector_is_the_only_one_admission_asks(form):
    plugins = [
        *BASE,
        {"type": "utilization-detector", "parameters": {"queueDepthThreshold": 100}},
        {"type": "prefill-backlog-detector"},
    ]
    ref = {"pluginRef": "prefill-backlog-detector"}
    section = {"flowControl": {"saturationDetector": ref}} if form == "flowControl" else {form: ref}
    doc = {"plugins": plugins, **section}
    sched = Scheduler.from_config(load_config(doc))
    assert sched.saturation_detector == "prefill-backlog-detector"
    named = admission_detectors(sched.plugins.values(), named=sched.saturation_detector)
    assert [d.type_name for d in named] == ["prefill-backlog-detector"]
    everyone = admission_detectors(sched.plugins.values())
    assert sorted(d.type_name for d in everyone) == ["prefill-backlog-detector", "utilization-detector"]


def test_report_lists_what_runs_and_what_is_refused():
    report = config_report(
        {
            "plugins": [*BASE, {"type": "tokenizer"}, {"type": "openai-parser"}],
            "featureGates": ["haPopulateNonLeaderDatastore", "flowControl"],
            "requestHandler": {"parsers": [{"pluginRef": "openai-parser"}]},
        }
    )
    status = {line.where: line.status for line in report.lines}
    assert status == {
        "plugin 'queue-scorer' (type queue-scorer)": "runs",
        "plugin 'max-score-picker' (type max-score-picker)": "runs",
        "plugin 'tokenizer' (type tokenizer)": "refused",
        "plugin 'openai-parser' (type openai-parser)": "runs",
        "featureGates[0] 'haPopulateNonLeaderDatastore'": "accepted",
        "featureGates[1] 'flowControl'": "accepted",
        "requestHandler.parsers[0]": "accepted",
    }
    assert report.config is None and len(report.errors) == 1
