"""The P/D benchmark's pure parts: workloads, flow throughput, decision counts, config variants, tables."""

from __future__ import annotations

import math

import pytest

from bench.pd_benchmark import PREFIX_TOKENS, SHORT_SUFFIX, Setup, long_prompts, shared_prefix, sim_row
from bench.pd_figures import DECODE_ONLY, PD, counts_delta, decision_counts, flow_throughput, flow_window, sim_markdown
from ray_epp.simulator import DEFAULT_MODEL, SimRequest
from tests.bench.helpers import pods

METRICS_PAGE = """# HELP ray_epp_pd_handoffs_total The gateway's P/D hand-offs by outcome.
# TYPE ray_epp_pd_handoffs_total counter
ray_epp_pd_handoffs_total{outcome="pd"} 11.0
ray_epp_pd_handoffs_total{outcome="pd-fallback"} 1.0
ray_epp_pd_handoffs_total{outcome="decode-only"} 3.0
ray_epp_pd_handoffs_total{outcome="failed"} 2.0
inference_objective_request_total{model_name="m",target_model_name="m",priority="0"} 15.0
"""


def test_long_prompts_are_5000_unique_tokens_with_250_out():
    wl = long_prompts(10.0, 2.0, seed=1)
    assert len(wl) == 20
    assert {r.prompt_tokens for r in wl} == {5000} and {r.max_tokens for r in wl} == {250}
    assert len(wl[0].prompt) == 20_000  # 4 characters a token
    assert len({r.prompt[:64] for r in wl}) == 20
    assert [r.arrival_time for r in wl] == sorted(r.arrival_time for r in wl)
    burst = long_prompts(0, 7, seed=1)
    assert len(burst) == 7 and {r.arrival_time for r in burst} == {0.0}


def test_shared_prefix_prompts_share_whole_blocks():
    wl = shared_prefix(20.0, 2.0, seed=1, suffix_tokens=SHORT_SUFFIX)
    assert {r.prompt_tokens for r in wl} == {PREFIX_TOKENS + SHORT_SUFFIX}
    assert PREFIX_TOKENS % 16 == 0
    prefixes = {r.prompt[: PREFIX_TOKENS * 4] for r in wl}
    assert 1 < len(prefixes) <= 16


def test_flow_throughput_counts_completions_inside_the_window():
    assert flow_window([0.0, 1.0, 2.0, 3.0, 4.0]) == (2.0, pytest.approx(3.8))
    finished = [(1.0, 250), (2.0, 250), (2.5, 100), (3.0, 250), (9.0, 250)]
    req_s, tok_s = flow_throughput(finished, (2.0, 4.0))
    assert req_s == pytest.approx(1.5) and tok_s == pytest.approx(300.0)
    assert all(math.isnan(x) for x in flow_throughput(finished, (3.0, 3.0)))


def test_decision_counts_from_the_gateway_metrics_page():
    before = decision_counts(METRICS_PAGE)
    assert before == {PD: 12.0, DECODE_ONLY: 3.0}
    after = decision_counts(METRICS_PAGE.replace("} 11.0", "} 19.0"))
    assert counts_delta(before, after) == {DECODE_ONLY: 0, PD: 8}
    assert decision_counts("") == {}


def test_setup_names_pods_and_config_override():
    assert Setup(both=8).name == "8 aggregated" and Setup(2, 6).name == "2P+6D"
    assert [p.role for p in Setup(1, 2).pods()] == ["prefill", "decode", "decode"]
    variant = Setup(4, 4, match_blocks=512)
    assert variant.name == "4P+4D, 512 blocks"
    prefix = next(p for p in variant.config()["plugins"] if p["type"] == "prefix-cache-scorer")
    assert prefix["parameters"]["maxPrefixBlocksToMatch"] == 512
    shipped = next(p for p in Setup(4, 4).config()["plugins"] if p["type"] == "prefix-cache-scorer")
    assert shipped["parameters"]["maxPrefixBlocksToMatch"] == 256


@pytest.mark.parametrize(("match_blocks", "second"), [(None, PD), (512, DECODE_ONLY)])
def test_a_cached_5000_token_prefix_is_decode_only_only_past_the_256_block_cap(match_blocks, second):
    """ray_epp/configs/pd.yaml matches at most 256 blocks (4,096 tokens): a 5,000-token prompt always has
    >= 16 'uncached' tokens, however much of it the decode pod holds."""
    router = Setup(1, 1, match_blocks=match_blocks).router()
    views = pods("prefill-0", role="prefill") + pods("decode-0", role="decode")
    prefix = "".join(f"{i:08x}" for i in range(PREFIX_TOKENS // 2))  # 2 tokens of 4 characters each
    first, repeat = (
        SimRequest.from_body(rid, 0.0, {"model": DEFAULT_MODEL, "prompt": prefix + rid * 4, "max_tokens": 8})
        for rid in ("ask-one!", "ask-two!")  # 8 unique tokens each
    )
    assert first.prompt_tokens == PREFIX_TOKENS + SHORT_SUFFIX
    assert router.route(first, views, 0.0) == ("prefill-0", "decode-0")
    decision = router.route(repeat, views, 1.0)
    assert (PD if isinstance(decision, tuple) else DECODE_ONLY) == second


def test_sim_row_and_table_for_a_tiny_pd_run():
    wl = long_prompts(4.0, 1.0, seed=2)
    row = sim_row(Setup(1, 1), wl, seed=0)
    assert row["completed"] == len(wl) and row["decisions"] == {PD: len(wl), DECODE_ONLY: 0}
    assert row["ttft_ms"]["p50"] > 150  # a 5,000-token prefill at 30 µs a token, then the KV transfer
    result = {
        "duration_s": 1.0,
        "seed": 0,
        "capacity": {"request_rate": 4.0, "method": "given"},
        "workloads": {"long-prompt": "long"},
        "runs": [{"workload": "long-prompt", "rate": 4.0, "fraction": 1.0, **row}],
    }
    table = sim_markdown(result)
    assert "| 4.0 (1x) | 1P+1D |" in table and f"| {len(wl)} / 0 |" in table


def test_rounds_setups_set_parallel_stages_and_scheduler_time_is_read():
    from bench.pd_benchmark import E2E_ROUNDS_SETUPS
    from bench.pd_figures import mean_ms, scheduler_time

    names = [s.name for s in E2E_ROUNDS_SETUPS]
    assert names == ["2P+2D, sequential rounds", "2P+2D, one round", "2P+2D, one round", "2P+2D, sequential rounds"]
    (handler,) = [p for p in E2E_ROUNDS_SETUPS[1].config()["plugins"] if p["type"] == "disagg-profile-handler"]
    assert handler["parameters"]["parallelStages"] is True
    assert Setup(2, 2).config() == Setup(2, 2, parallel_stages=None).config()
    page = (
        'inference_extension_scheduler_e2e_duration_seconds_sum{model_name="m"} 0.5\n'
        'inference_extension_scheduler_e2e_duration_seconds_count{model_name="m"} 100.0\n'
        'inference_extension_scheduler_e2e_duration_seconds_bucket{le="0.005"} 90.0\n'
    )
    assert scheduler_time(page) == (0.5, 100.0)
    assert mean_ms((0.5, 100.0), (0.8, 200.0)) == pytest.approx(3.0)
    assert mean_ms((0.5, 100.0), (0.5, 100.0)) is None
