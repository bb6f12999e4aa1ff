"""Engine metric specs and the Prometheus text -> Metrics parser, on real vLLM / SGLang pages
(tests/fixtures/metrics, see SOURCES.md there) and on small texts in GIE's shapes."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from scheduler import Metrics
from scheduler.engine_metrics import (
    PRESETS,
    SGLANG,
    TRITON_TRTLLM,
    TRTLLM_SERVE,
    VLLM,
    EngineRegistry,
    MetricSpec,
    engine_for_labels,
    family_lines,
    parse_metric_spec,
    parse_metrics,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "metrics"
VLLM_V1 = (FIXTURES / "vllm_v1_qwen1.5_0.5b.prom").read_text()
VLLM_V0_LORA = (FIXTURES / "vllm_v0_lora_qwen2.5_coder.prom").read_text()
SGLANG_PAGE = (FIXTURES / "sglang_llama3.1_8b.prom").read_text()


def with_value(text: str, metric: str, value: str) -> str:
    """The page with every sample of `metric` set to `value`."""
    pattern = re.compile(r"^(" + re.escape(metric) + r"(?:\{[^\n]*\})?) \S+$", re.M)
    out, n = pattern.subn(lambda m: f"{m.group(1)} {value}", text)
    assert n, f"{metric} not in the page"
    return out


def fields(m: Metrics) -> dict:
    d = m.to_json()
    d.pop("update_time")
    return d


# --- the real pages -------------------------------------------------------------------------------

REAL_PAGES = [
    pytest.param(
        VLLM_V1,
        VLLM,
        {"waiting_queue_size": 0, "running_requests_size": 0, "kv_cache_usage_percent": 0.0,
         "cache_block_size": 16, "cache_num_blocks": 2452, "max_active_models": 0},
        ["LoRA info: metric family 'vllm:lora_requests_info' not found"],
        id="vllm-v1-full-page",
    ),
    pytest.param(
        with_value(with_value(with_value(VLLM_V1, "vllm:num_requests_waiting", "7.0"),
                              "vllm:num_requests_running", "3.0"), "vllm:kv_cache_usage_perc", "0.4375"),
        VLLM,
        {"waiting_queue_size": 7, "running_requests_size": 3, "kv_cache_usage_percent": 0.4375},
        ["LoRA info: metric family 'vllm:lora_requests_info' not found"],
        id="vllm-v1-busy",
    ),
    pytest.param(
        VLLM_V0_LORA,
        VLLM,  # KV usage from the pre-0.10 name vllm:gpu_cache_usage_perc
        {"waiting_queue_size": 0, "kv_cache_usage_percent": 0.0, "max_active_models": 0,
         "active_models": [], "cache_block_size": 16, "cache_num_blocks": 81767},
        [],
        id="vllm-v0-lora-gpu-cache-name",
    ),
    pytest.param(
        with_value(VLLM_V0_LORA, "vllm:gpu_cache_usage_perc", "0.25"),
        VLLM,
        {"kv_cache_usage_percent": 0.25},
        [],
        id="vllm-v0-kv-fallback-value",
    ),
    pytest.param(
        SGLANG_PAGE,
        SGLANG,
        {"waiting_queue_size": 2826, "running_requests_size": 162, "kv_cache_usage_percent": 0.28,
         "cache_block_size": 0},
        ["cache info: metric family 'sglang:cache_config_info' not found"],
        id="sglang-page",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("text", "spec", "expected", "warnings"), REAL_PAGES)
def test_real_pages(text, spec, expected, warnings):
    result = parse_metrics(text, spec)
    assert result.ok, result.errors
    got = fields(result.metrics)
    assert {k: got[k] for k in expected} == expected
    assert list(result.warnings) == warnings


def test_real_pages_agree_with_prometheus_client():
    """Our cheap scan reads the same values prometheus_client's full parser reads."""
    for text, names in (
        (VLLM_V1, ["vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"]),
        (SGLANG_PAGE, ["sglang:num_queue_reqs", "sglang:num_running_reqs", "sglang:token_usage"]),
    ):
        reference = {
            s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples if s.name in names
        }
        spec = VLLM if names[0].startswith("vllm") else SGLANG
        m = parse_metrics(text, spec).metrics
        assert [m.waiting_queue_size, m.running_requests_size, m.kv_cache_usage_percent] == [
            int(reference[names[0]]),
            int(reference[names[1]]),
            reference[names[2]],
        ]


def test_the_other_fifty_families_are_never_parsed():
    lines = family_lines(VLLM_V1, "vllm:num_requests_waiting")
    assert lines == ['{engine="0",model_name="Qwen/Qwen1.5-0.5B-Chat"} 0.0']
    # a name that is a prefix of others (vllm:request_success_total vs ..._created) matches itself only
    assert len(family_lines(VLLM_V1, "vllm:request_success_total")) == 3


# --- GIE's extraction rules, table-driven ---------------------------------------------------------

BASE = "vllm:num_requests_waiting 1\nvllm:num_requests_running 2\nvllm:kv_cache_usage_perc 0.5\n"

LORA = "vllm:lora_requests_info"
CASES = [
    # (id, text, expected fields, error substrings, warning substrings)
    ("minimal", BASE, {"waiting_queue_size": 1, "running_requests_size": 2, "kv_cache_usage_percent": 0.5}, [],
     ["LoRA", "cache info"]),
    ("lora newest value wins",
     BASE + LORA + '{max_lora="2",running_lora_adapters="sql-lora",waiting_lora_adapters=""} 1.7907e+09\n'
     + LORA + '{max_lora="2",running_lora_adapters="sql-lora, chat-lora",waiting_lora_adapters="x"} 1.7907001e+09\n'
     + LORA + '{max_lora="2",running_lora_adapters="old",waiting_lora_adapters=""} 1.79e+09\n',
     {"active_models": ["chat-lora", "sql-lora"], "waiting_models": ["x"], "max_active_models": 2}, [], ["cache info"]),
    ("lora bad max_lora keeps the adapters",
     BASE + 'vllm:lora_requests_info{max_lora="many",running_lora_adapters="a",waiting_lora_adapters=""} 1\n',
     {"active_models": ["a"], "max_active_models": 0}, [], ["max_lora='many' is not an integer"]),
    ("cache config from labels",
     BASE + 'vllm:cache_config_info{block_size="32",num_gpu_blocks="1024",cache_dtype="auto"} 1.0\n',
     {"cache_block_size": 32, "cache_num_blocks": 1024}, [], ["LoRA"]),
    ("newest timestamp wins, else the first sample",
     'vllm:num_requests_waiting{engine="0"} 4 1000\nvllm:num_requests_waiting{engine="1"} 9 2000\n'
     'vllm:num_requests_running{engine="0"} 5\nvllm:num_requests_running{engine="1"} 6\n'
     'vllm:kv_cache_usage_perc 0.1\n',
     {"waiting_queue_size": 9, "running_requests_size": 5}, [], []),
    ("missing required metric is an error, the rest still read",
     'vllm:num_requests_running 2\nvllm:kv_cache_usage_perc 0.5\n',
     {"running_requests_size": 2, "kv_cache_usage_percent": 0.5},
     ["queued requests: metric family 'vllm:num_requests_waiting' not found"], []),
    ("kv missing under both names",
     'vllm:num_requests_waiting 1\nvllm:num_requests_running 2\n', {},
     ["'vllm:kv_cache_usage_perc' or 'vllm:gpu_cache_usage_perc' not found"], []),
    ("unparsable value", BASE.replace("2\n", "two\n"), {}, ["running requests: unparsable value 'two'"], []),
    ("NaN queue", BASE.replace(" 1\n", " NaN\n"), {}, ["value nan is not a number"], []),
    ("scientific and special floats", BASE.replace(" 1\n", " 1.2e+01\n").replace(" 0.5\n", " +Inf\n"),
     {"waiting_queue_size": 12, "kv_cache_usage_percent": float("inf")}, [], []),
    ("CRLF line ends", BASE.replace("\n", "\r\n"), {"waiting_queue_size": 1, "kv_cache_usage_percent": 0.5}, [], []),
    ("escaped label values",
     BASE + 'vllm:lora_requests_info{max_lora="1",running_lora_adapters="a\\"b,c\\\\d",waiting_lora_adapters=""} 1\n',
     {"active_models": ['a"b', "c\\d"]}, [], []),
    ("first line of the page",
     "vllm:num_requests_waiting 3\n# HELP x\nvllm:num_requests_running 0\nvllm:kv_cache_usage_perc 0",
     {"waiting_queue_size": 3}, [], []),
    ("HTML instead of metrics", "<html><body>502 Bad Gateway</body></html>", {},
     ["queued requests", "running requests", "KV-cache usage"], []),
    ("garbage line of a wanted family", "vllm:num_requests_running{{{ not prometheus \x00 garbage\n", {},
     ["malformed sample line"], []),
]  # fmt: skip


@pytest.mark.parametrize(("text", "expected", "errors", "warnings"), [pytest.param(*c[1:], id=c[0]) for c in CASES])
def test_extraction_rules(text, expected, errors, warnings):
    result = parse_metrics(text, VLLM)
    got = fields(result.metrics)
    assert {k: got[k] for k in expected} == expected
    assert result.ok is (not errors)
    for e in errors:
        assert any(e in x for x in result.errors), (e, result.errors)
    for w in warnings:
        assert any(w in x for x in result.warnings), (w, result.warnings)


def test_missing_optional_metrics_keep_the_previous_values():
    previous = Metrics(active_models={"a": 0}, max_active_models=4, cache_block_size=16, cache_num_blocks=9)
    result = parse_metrics(BASE, VLLM, previous)
    assert result.ok
    assert result.metrics.active_models == {"a": 0} and result.metrics.cache_num_blocks == 9
    assert result.metrics is not previous and result.metrics.active_models is not previous.active_models


def test_pathological_lines_parse_in_linear_time():
    for line in ("{" * 20000, '{a="' + "x" * 20000, '{a="b" ' + "} " * 10000, "{a=" + "b," * 10000):
        start = time.perf_counter()
        result = parse_metrics(f"vllm:num_requests_waiting{line}\n", VLLM)
        assert time.perf_counter() - start < 0.05
        assert not result.ok and len(result.error) < 400  # the bad line is shortened in the message


def test_non_text_input_is_an_error_not_an_exception():
    result = parse_metrics(b"vllm:num_requests_waiting 1", VLLM)  # type: ignore[arg-type]
    assert not result.ok and "not text" in result.error


# --- presets and selection -------------------------------------------------------------------------

TRITON_PAGE = """# TYPE nv_trt_llm_request_metrics gauge
nv_trt_llm_request_metrics{model="ensemble",request_type="context",version="1"} 1
nv_trt_llm_request_metrics{model="ensemble",request_type="scheduled",version="1"} 3
nv_trt_llm_request_metrics{model="ensemble",request_type="waiting",version="1"} 8
# TYPE nv_trt_llm_kv_cache_block_metrics gauge
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max",model="ensemble",version="1"} 4096
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per",model="ensemble",version="1"} 64
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction",model="ensemble",version="1"} 0.75
"""
TRTLLM_PAGE = """trtllm_num_requests_waiting 2
trtllm_num_requests_running 5
trtllm_kv_cache_utilization 0.125
trtllm_kv_cache_tokens_per_block 32
trtllm_kv_cache_max_blocks 100
"""
SGLANG_CACHE = (
    "sglang:num_queue_reqs 1\nsglang:num_running_reqs 2\nsglang:token_usage 0.5\n"
    'sglang:cache_config_info{page_size="64",num_pages="11147"} 1.0\n'
)


@pytest.mark.parametrize(
    ("spec", "text", "expected"),
    [
        pytest.param(TRITON_TRTLLM, TRITON_PAGE, (8, 3, 0.75, 64, 4096), id="triton-tensorrt-llm"),
        pytest.param(TRTLLM_SERVE, TRTLLM_PAGE, (2, 5, 0.125, 32, 100), id="trtllm-serve"),
        pytest.param(SGLANG, SGLANG_CACHE, (1, 2, 0.5, 64, 11147), id="sglang-cache-info-labels"),
    ],
)
def test_engine_presets(spec, text, expected):
    result = parse_metrics(text, spec)
    assert result.ok, result.errors
    m = result.metrics
    got = (m.waiting_queue_size, m.running_requests_size, m.kv_cache_usage_percent, m.cache_block_size,
           m.cache_num_blocks)  # fmt: skip
    assert got == expected


def test_presets_are_gies():
    assert sorted(PRESETS) == ["sglang", "triton-tensorrt-llm", "trtllm-serve", "vllm"]
    assert str(TRITON_TRTLLM.queued[0]) == "nv_trt_llm_request_metrics{request_type=waiting}"
    assert SGLANG.lora is None and (SGLANG.cache_block_size_label, SGLANG.cache_num_blocks_label) == (
        "page_size",
        "num_pages",
    )
    assert [s.name for s in VLLM.kv_usage] == ["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"]


@pytest.mark.parametrize(
    ("labels", "engine"),
    [
        ({}, "vllm"),
        (None, "vllm"),
        ({"inference.networking.k8s.io/engine-type": "sglang"}, "sglang"),
        ({"inference.networking.k8s.io/engine-type": "triton-tensorrt-llm"}, "triton-tensorrt-llm"),
        ({"inference.networking.k8s.io/engine-type": "no-such-engine"}, "vllm"),
        ({"inference.networking.k8s.io/engine-type": ""}, "vllm"),
    ],
)
def test_engine_chosen_by_pod_label(labels, engine):
    assert engine_for_labels(labels).name == engine


def test_registry_from_gie_parameters():
    registry = EngineRegistry.from_params(
        {
            "engineLabelKey": "engine",
            "defaultEngine": "mine",
            "engineConfigs": [
                {"name": "mine", "queuedRequestsSpec": "q", "runningRequestsSpec": 'r{x="1"}', "kvUsageSpec": "kv"},
                {"name": "vllm", "queuedRequestsSpec": "vllm:num_requests_waiting"},  # replaces the preset
            ],
        }
    )
    assert registry.for_labels({}).name == "mine"
    assert registry.for_labels({"engine": "sglang"}) is SGLANG
    assert registry.for_labels({"engine": "vllm"}).kv_usage == ()
    mine = registry.for_labels({"engine": "mine"})
    assert mine.running == (MetricSpec("r", (("x", "1"),)),)
    assert parse_metrics('q 4\nr{x="0"} 1\nr{x="1"} 2\nkv 0.5\n', mine).metrics.running_requests_size == 2


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"engineConfigs": [{"queuedRequestsSpec": "q"}]}, "engineConfigs[0]: engine config name cannot be empty"),
        ({"engineConfigs": [{"name": "default"}]}, "reserved"),
        ({"engineConfigs": [{"name": "x", "queueSpec": "q"}]}, "engineConfigs[0] 'x': unknown fields ['queueSpec']"),
        ({"engineConfigs": [{"name": "x", "kvUsageSpec": "{a=b}"}]}, "engineConfigs[0] 'x': not a valid metric"),
        ({"defaultEngine": "nope"}, "defaultEngine 'nope' not found"),
        ({"engineLabel": "x"}, "unknown metrics-extractor parameters"),
    ],
)
def test_registry_parameter_errors(params, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        EngineRegistry.from_params(params)


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("", None),
        ("  ", None),
        ("vllm:num_requests_waiting", MetricSpec("vllm:num_requests_waiting")),
        ("m{a=b}", MetricSpec("m", (("a", "b"),))),
        ('m{ b = "x y", a=c }', MetricSpec("m", (("a", "c"), ("b", "x y")))),
        ('m{a!="b",__name__="m",c=d}', MetricSpec("m", (("c", "d"),))),
    ],
)
def test_metric_spec_syntax(text, spec):
    assert parse_metric_spec(text) == spec


@pytest.mark.parametrize("text", ["{a=b}", "m{a=}", "m{=b}", "m b", "1m"])
def test_bad_metric_specs(text):
    with pytest.raises(ValueError, match="not a valid metric specification"):
        parse_metric_spec(text)
