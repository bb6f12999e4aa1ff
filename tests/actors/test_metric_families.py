"""The metric catalogue and the page it renders, without Ray: views show their source's samples
under other labels and coarser buckets, a dead source's gauges leave the sum, and every family has
its row in docs/OBSERVABILITY.md."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from actors.metric_families import FAMILIES, HISTOGRAM, LLMD_TTFT
from actors.metrics_hub import GAUGE_TTL_S, MetricsRecorder, live_states, render

DOC = Path(__file__).resolve().parents[2] / "docs" / "OBSERVABILITY.md"
L = ("m", "m", "tenant", "0")


def families(text: bytes) -> dict:
    parsed = text_string_to_metric_families(text.decode())
    return {f.name + ("_total" if f.type == "counter" else ""): f for f in parsed}


def buckets(fam, **labels) -> dict[str, float]:
    return {
        s.labels["le"]: s.value
        for s in fam.samples
        if s.name.endswith("_bucket") and all(s.labels.get(k) == v for k, v in labels.items())
    }


def test_every_family_has_a_row_and_every_documented_name_is_exported_or_refused():
    doc = DOC.read_text()
    for fam in FAMILIES.values():
        if fam.exposed:
            assert f"| `{fam.name}` |" in doc, f"{fam.name} has no row in docs/OBSERVABILITY.md"
    refused = doc.split("## Not exported", 1)[1].split("\n## ", 1)[0]
    for name in re.findall(r"`((?:inference|llm_d|kvcache|moriio)_[a-z_]+)`", refused):
        assert name not in FAMILIES, f"{name} is exported and listed as not exported"


def test_a_request_recorded_once_shows_under_gie_and_llmd_names():
    r = MetricsRecorder()
    r.inc("llm_d_epp_request_total", L, 2)
    r.inc("llm_d_epp_request_total", ("m", "m", "other", "0"))
    r.observe("llm_d_epp_request_size_bytes", 100, L)
    r.add_gauge("llm_d_epp_request_running", L, 1)
    fams = families(render([r.state()]))
    [gie] = fams["inference_objective_request_total"].samples
    assert gie.labels == {"model_name": "m", "target_model_name": "m", "priority": "0"} and gie.value == 3
    assert {s.labels["fairness_id"]: s.value for s in fams["llm_d_epp_request_total"].samples} == {
        "tenant": 2,
        "other": 1,
    }
    assert buckets(fams["inference_objective_request_sizes"])["128.0"] == 1
    assert fams["inference_objective_running_requests"].samples[0].labels == {"model_name": "m"}


def test_a_view_merges_buckets_filters_and_renames():
    r = MetricsRecorder()
    for seconds, streaming in ((0.3, "true"), (200.0, "false"), (5000.0, "false")):
        r.observe("ray_epp_request_ttft_seconds", seconds, (*L, streaming))
    r.inc("llm_d_epp_scheduler_attempts_total", ("success", "m", "pod-a", "", "8000"))
    fams = families(render([r.state()]))
    llmd = fams["llm_d_epp_request_ttft_seconds"]
    assert list(buckets(llmd, streaming="false")) == [*map(_go, LLMD_TTFT), "+Inf"]  # its own buckets
    assert buckets(llmd, streaming="false")["120.0"] == 0 and buckets(llmd, streaming="false")["+Inf"] == 2
    gie = fams["inference_objective_request_ttft_seconds"]  # streams only, up to 3600 s
    assert buckets(gie)["0.4"] == 1 and buckets(gie)["+Inf"] == 1
    [attempt] = fams["inference_extension_scheduler_attempts_total"].samples
    assert attempt.labels["pod_name"] == "pod-a" and "endpoint_name" not in attempt.labels


def test_every_family_is_on_an_empty_page_with_its_type():
    fams = families(render([MetricsRecorder().state()]))
    for fam in FAMILIES.values():
        if fam.exposed:
            assert fams[fam.name].type == fam.kind, fam.name
        else:
            assert fam.name not in fams


def test_collectors_report_when_the_state_is_taken():
    r = MetricsRecorder()
    size = [3.0]
    r.add_collector(lambda: {("llm_d_epp_prefix_indexer_size", ("p", "approx-prefix-cache-producer")): size[0]})
    r.add_collector(lambda: 1 / 0)  # a broken one does not stop the others
    assert r.state()["gauges"][("llm_d_epp_prefix_indexer_size", ("p", "approx-prefix-cache-producer"))] == 3.0
    size[0] = 5.0
    assert families(render([r.state()]))["inference_extension_prefix_indexer_size"].samples[0].value == 5.0


def test_a_silent_source_keeps_its_counts_but_not_its_gauges():
    r = MetricsRecorder()
    r.inc("llm_d_epp_request_total", L)
    r.add_gauge("llm_d_epp_request_running", L, 1)
    states = {"gateway-1": r.state(), "gateway-2": r.state()}
    now = 1000.0
    live = live_states(states, {"gateway-1": now - 1, "gateway-2": now - GAUGE_TTL_S - 1}, now)
    fams = families(render(live))
    assert fams["llm_d_epp_request_total"].samples[0].value == 2
    assert fams["llm_d_epp_request_running"].samples[0].value == 1


def test_an_unknown_histogram_name_is_an_error():
    with pytest.raises(KeyError):
        MetricsRecorder().observe("no_such_family_seconds", 1.0)


def test_histogram_families_have_increasing_buckets():
    for fam in FAMILIES.values():
        if fam.kind == HISTOGRAM:
            assert list(fam.buckets) == sorted(set(fam.buckets)), fam.name


def _go(x: float) -> str:
    from prometheus_client.utils import floatToGoString

    return floatToGoString(x)
