"""The engine model in virtual time: batching, prefix cache, queueing, LoRA slots, P/D, determinism."""

from __future__ import annotations

import pytest

from ray_epp.simulator import ClusterSim, Engine, PodConfig, TimingConfig, generate_workload
from ray_epp.simulator.kv_cache import KVCache
from ray_epp.simulator.timing import StepCost

from .helpers import run_one_pod, sim_request, text_tokens

POD = PodConfig(name="p")


def test_prefix_hit_cuts_ttft_and_reports_cached_tokens() -> None:
    prompt = text_tokens(2000, "a")
    res = run_one_pod(
        POD,
        [
            sim_request("cold", 0.0, prompt),
            sim_request("warm", 5.0, prompt),  # after "cold" finished: its blocks are cached
            sim_request("other", 10.0, text_tokens(2000, "b")),
        ],
    )
    assert res["cold"].cached_tokens == 0
    assert res["warm"].cached_tokens == 1984  # whole blocks, never the last token
    assert res["other"].cached_tokens == 0
    assert res["warm"].ttft < res["cold"].ttft / 5
    assert res["other"].ttft == pytest.approx(res["cold"].ttft)


def test_prefix_cache_off_gives_no_hits() -> None:
    prompt = text_tokens(800, "a")
    cfg = PodConfig(name="p", enable_prefix_caching=False)
    res = run_one_pod(cfg, [sim_request("a", 0.0, prompt), sim_request("b", 5.0, prompt)])
    assert res["b"].cached_tokens == 0
    assert res["b"].ttft == pytest.approx(res["a"].ttft)


def test_queueing_raises_ttft() -> None:
    cfg = PodConfig(name="p", max_num_seqs=2)
    reqs = [sim_request(f"r{i}", 0.0, text_tokens(100, f"q{i}"), max_tokens=50) for i in range(6)]
    res = run_one_pod(cfg, reqs)
    ttfts = [res[f"r{i}"].ttft for i in range(6)]
    # pairs run together; each later pair waits for the previous one's 50 tokens
    assert ttfts[2] > ttfts[0] + 0.2
    assert ttfts[4] > ttfts[2] + 0.2
    assert res["r5"].queue_wait > res["r3"].queue_wait > res["r1"].queue_wait


def test_waiting_queue_is_reported_while_requests_wait() -> None:
    eng = Engine(PodConfig(name="p", max_num_seqs=1))
    for i in range(3):
        eng.add(eng.new_request(f"r{i}", text_tokens(50, f"w{i}"), 10, 0.0))
    eng.begin_step(0.0)
    snap = eng.snapshot()
    assert (snap["running_requests_size"], snap["waiting_queue_size"]) == (1, 2)
    assert snap["kv_cache_usage_percent"] > 0


def _mean_itl(batch: int, prompt: int) -> float:
    reqs = [sim_request(f"r{i}", 0.0, text_tokens(prompt, f"i{i}"), max_tokens=64) for i in range(batch)]
    return sum(r.itl for r in run_one_pod(POD, reqs).values()) / batch


@pytest.mark.parametrize(("batch", "prompt"), [(1, 100), (16, 100), (64, 100), (4, 2000)])
def test_decode_itl_follows_the_step_model(batch: int, prompt: int) -> None:
    # the whole batch prefills in one step, then decodes together: every step is the same shape
    t = TimingConfig()
    expected = t.step_overhead_s + batch * t.decode_per_seq_s + batch * (prompt + 32) * t.kv_read_per_token_s
    assert _mean_itl(batch, prompt) == pytest.approx(expected, rel=0.02)


def test_decode_itl_grows_with_batch_and_context() -> None:
    assert _mean_itl(1, 100) < _mean_itl(16, 100) < _mean_itl(64, 100) < _mean_itl(64, 1000)


def test_chunked_prefill_spreads_a_long_prompt_over_steps() -> None:
    cfg = PodConfig(name="p", max_num_batched_tokens=256)
    res = run_one_pod(cfg, [sim_request("long", 0.0, text_tokens(1000, "c"), max_tokens=1)])
    t = TimingConfig()
    # four steps of prefill: 256 + 256 + 256 + 232 tokens, each paying the step overhead
    assert res["long"].ttft > 4 * t.step_overhead_s + 1000 * t.prefill_per_token_s


def test_prefill_slows_the_decodes_sharing_its_step() -> None:
    decoder = sim_request("dec", 0.0, text_tokens(50, "d"), max_tokens=40)
    alone = run_one_pod(POD, [decoder])["dec"].itl
    busy = run_one_pod(POD, [decoder, sim_request("big", 0.05, text_tokens(6000, "e"), max_tokens=1)])["dec"].itl
    assert busy > alone * 1.3


def test_kv_pressure_preempts_and_everything_still_finishes() -> None:
    cfg = PodConfig(name="p", num_gpu_blocks=64, block_size=16)  # 1024 tokens of KV
    reqs = [sim_request(f"r{i}", 0.0, text_tokens(200, f"k{i}"), max_tokens=200) for i in range(4)]
    report = ClusterSim([cfg], lambda r, p, n: "p").run(reqs)
    assert report.completed == 4
    assert report.preemptions > 0
    assert all(r.output_tokens == 200 for r in report.results)


def test_request_needing_more_kv_than_the_pod_has_is_rejected() -> None:
    cfg = PodConfig(name="p", num_gpu_blocks=8, block_size=16)
    res = run_one_pod(cfg, [sim_request("big", 0.0, text_tokens(200, "z"), max_tokens=4)])
    assert res["big"].status == "rejected"


def test_lora_slot_limit_holds_and_waiters_get_slots_later() -> None:
    eng = Engine(PodConfig(name="p", max_loras=2, lora_adapters=["a", "b", "c"]))
    for i, name in enumerate(["a", "b", "c", "a"]):
        eng.add(eng.new_request(f"r{i}", text_tokens(40, f"l{i}"), 5, 0.0, lora=name))
    now, seen_c_waiting = 0.0, False
    while eng.has_work():
        end = eng.begin_step(now)
        assert end is not None
        running = eng.lora.running_adapters()
        assert len(running) <= 2
        if "c" in eng.waiting_adapters():
            seen_c_waiting = True
            assert sorted(running) == ["a", "b"]
        now = end
        eng.finish_step()
    assert seen_c_waiting
    assert eng.lora.loads == 3


def test_lora_load_time_is_paid_once_per_activation() -> None:
    t = TimingConfig(lora_load_s=0.5)
    cfg = PodConfig(name="p", max_loras=1, lora_adapters=["a", "b"], timing=t)
    res = run_one_pod(
        cfg,
        [
            sim_request("a1", 0.0, text_tokens(40, "x"), model="a"),
            sim_request("a2", 2.0, text_tokens(40, "y"), model="a"),  # resident: no load
            sim_request("b1", 4.0, text_tokens(40, "z"), model="b"),  # evicts a: load
        ],
    )
    assert res["a1"].lora_loaded and not res["a2"].lora_loaded and res["b1"].lora_loaded
    assert res["a1"].ttft > 0.5 > res["a2"].ttft


def test_the_same_text_under_two_adapters_shares_no_blocks() -> None:
    cfg = PodConfig(name="p", lora_adapters=["a"])
    prompt = text_tokens(500, "s")
    res = run_one_pod(cfg, [sim_request("base", 0.0, prompt), sim_request("lora", 2.0, prompt, model="a")])
    assert res["lora"].cached_tokens == 0


def test_pd_split_pays_transfer_instead_of_prefill() -> None:
    pods = [PodConfig(name="pre", role="prefill"), PodConfig(name="dec", role="decode")]
    prompt = text_tokens(3000, "p")
    report = ClusterSim(pods, lambda r, p, n: ("pre", "dec")).run([sim_request("r", 0.0, prompt, max_tokens=8)])
    (r,) = report.results
    assert (r.prefill_pod, r.pod, r.output_tokens) == ("pre", "dec", 8)
    t = TimingConfig()
    prefill = t.step_overhead_s + 3000 * t.prefill_per_token_s
    assert r.ttft > prefill + t.kv_transfer_latency_s + 2999 * t.kv_transfer_per_token_s
    assert report.pods[1].prefix_queries == 3000 and report.pods[1].prefix_hits == 0


def test_engine_is_deterministic_under_a_seed() -> None:
    cfg = PodConfig(name="p", output_length="random", max_num_seqs=8)
    wl = generate_workload(num_requests=200, rate=50, prefix_groups=3, prefix_tokens=256, seed=7)
    for r in wl:
        r.ignore_eos, r.output_tokens = False, None  # let the pod draw the output length

    def run(seed: int) -> list[tuple[str, float, int]]:
        rep = ClusterSim([cfg], lambda r, p, n: "p", seed=seed).run(wl)
        return [(r.request_id, r.e2e, r.output_tokens) for r in rep.results]

    assert run(1) == run(1)
    assert run(1) != run(2)


def test_multi_step_runs_match_single_steps_exactly() -> None:
    wl = generate_workload(num_requests=300, rate=30, prefix_groups=2, prefix_tokens=256, seed=3)
    cfg = [PodConfig(name="p", num_gpu_blocks=400)]
    single = ClusterSim(cfg, lambda r, p, n: "p", max_steps=1).run(wl)
    multi = ClusterSim(cfg, lambda r, p, n: "p").run(wl)
    assert [r.e2e for r in single.results] == pytest.approx([r.e2e for r in multi.results], abs=1e-9)
    assert single.pods[0].steps == multi.pods[0].steps


@pytest.mark.parametrize(
    ("ops", "expect_free", "expect_cached"),
    [
        ([("alloc", 4)], 0, 0),
        ([("alloc", 4), ("cache", 0), ("release", 0)], 1, 1),
        # a fifth block must evict the least recently freed cached block
        ([("alloc", 4), ("cache", 0), ("cache", 1), ("release", 0), ("release", 1), ("alloc", 1)], 1, 1),
    ],
)
def test_kv_cache_block_pool(ops: list[tuple[str, int]], expect_free: int, expect_cached: int) -> None:
    kv = KVCache(4, 16)
    blocks: list[int] = []
    for op, arg in ops:
        if op == "alloc":
            got = kv.allocate(arg)
            assert got is not None
            blocks += got
        elif op == "cache":
            kv.cache_block(blocks[arg], 1000 + arg)
        else:
            kv.release([blocks[arg]])
    assert kv.num_free == expect_free
    assert len(kv.cached) == expect_cached
    assert kv.allocate(kv.num_free + 1) is None


def test_lru_keeps_the_most_recently_used_prefix() -> None:
    kv = KVCache(2, 16)
    a, b = kv.allocate(1), kv.allocate(1)
    assert a is not None and b is not None
    kv.cache_block(a[0], 1)
    kv.cache_block(b[0], 2)
    kv.release(a)
    kv.release(b)
    kv.acquire(kv.match_prefix([1], 1))  # touch hash 1: it becomes the most recently used
    kv.release([a[0]])
    kv.allocate(1)  # evicts hash 2
    assert kv.match_prefix([1], 1) == a and kv.match_prefix([2], 1) == []


@pytest.mark.parametrize("budget", [0.0, 0.004, 0.05, 1.0, 100.0])
def test_steps_within_agrees_with_the_step_sum(budget: float) -> None:
    cost = StepCost(TimingConfig())
    k = cost.steps_within(10, 5000, budget, 10_000)
    assert k == 1 or cost.decode_run(10, 5000, k - 1) <= budget
    assert k == 10_000 or cost.decode_run(10, 5000, k) > budget
