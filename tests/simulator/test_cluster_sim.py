"""The virtual-time cluster simulation: routers, staleness, P/D pairs, reports, workloads."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import aiohttp
import pytest

from ray_epp.simulator import (
    BASELINES,
    PodConfig,
    PodView,
    RequestResult,
    Router,
    SimCluster,
    SimRequest,
    WorkloadSpec,
    generate_workload,
    make_pod_configs,
    run_cluster_sim,
)
from ray_epp.simulator.report import percentile

from .helpers import completion, sim_request, stream_ttft, text_tokens


@pytest.mark.parametrize("name", sorted(BASELINES))
def test_baselines_serve_a_workload_across_all_pods(name: str) -> None:
    wl = generate_workload(num_requests=400, rate=100, prompt_tokens=(32, 256), output_tokens=(8, 64), seed=1)
    report = run_cluster_sim(make_pod_configs(4), wl, BASELINES[name](seed=0))
    assert report.completed == 400 and report.dropped == 0
    per_pod = [p.requests for p in report.pods]
    assert min(per_pod) > 50
    if name == "round-robin":
        assert per_pod == [100, 100, 100, 100]
    assert report.request_throughput == pytest.approx(400 / report.duration)
    assert report.ttft.p50 <= report.ttft.p90 <= report.ttft.p99


def test_baselines_skip_prefill_only_pods() -> None:
    pods = [PodConfig(name="pre", role="prefill"), PodConfig(name="d0"), PodConfig(name="d1", role="decode")]
    wl = generate_workload(num_requests=50, rate=50, seed=2)
    for name, cls in BASELINES.items():
        report = run_cluster_sim(pods, wl, cls(seed=0))
        assert report.pods[0].requests == 0, name


def test_stale_metrics_cost_least_queue_its_balance() -> None:
    # a burst of 64 requests inside one scrape interval: with stale metrics every pod looks idle
    wl = generate_workload(num_requests=64, rate=4000, prompt_tokens=(64, 64), output_tokens=(32, 32), seed=4)
    pods = make_pod_configs(8)
    fresh = run_cluster_sim(pods, wl, BASELINES["least-queue"](seed=0), scrape_interval=0.0)
    stale = run_cluster_sim(pods, wl, BASELINES["least-queue"](seed=0), scrape_interval=1.0)
    assert [p.requests for p in fresh.pods] == [8] * 8  # fresh metrics: perfectly even
    assert max(p.requests for p in stale.pods) > 8  # stale: a random spread among "idle" pods
    assert stale.e2e.max > fresh.e2e.max


def test_router_sees_pod_views_in_design_json_form() -> None:
    seen: list[list[PodView]] = []

    def router(request: SimRequest, pods: list[PodView], now: float) -> str:
        seen.append(pods)
        return pods[0].name

    run_cluster_sim([PodConfig(name="a", labels={"zone": "z1"})], [sim_request("r", 0.0, "hi")], router)
    view = seen[0][0]
    assert view.name == "a" and view.labels == {"zone": "z1", "llm-d.ai/role": "both"} and view.role == "both"
    assert set(view.metrics) == {
        "waiting_queue_size", "running_requests_size", "kv_cache_usage_percent", "active_models",
        "waiting_models", "max_active_models", "cache_block_size", "cache_num_gpu_blocks",
    }  # fmt: skip


def test_drops_rejections_and_the_completion_hook() -> None:
    class Picky:
        def __init__(self) -> None:
            self.completed: list[tuple[str, str | None, str]] = []

        def route(self, request: SimRequest, pods: list[PodView], now: float) -> str | None:
            return None if request.priority < 0 else "a"

        def on_complete(self, request: SimRequest, pod: str | None, result: RequestResult) -> None:
            self.completed.append((request.request_id, pod, result.status))

    router = Picky()
    assert isinstance(router, Router)
    wl = [
        SimRequest.from_body("shed", 0.0, completion("x"), priority=-1),
        SimRequest.from_body("ok", 0.1, completion("x")),
        SimRequest.from_body("too-long", 0.2, completion("x" * 4 * 9000)),
        SimRequest.from_body("no-model", 0.3, completion("x", model="nope")),
    ]
    report = run_cluster_sim([PodConfig(name="a")], wl, router)
    assert (report.completed, report.dropped, report.rejected) == (1, 1, 2)
    assert sorted(router.completed) == [
        ("no-model", "a", "rejected"), ("ok", "a", "ok"), ("shed", None, "dropped"), ("too-long", "a", "rejected"),
    ]  # fmt: skip
    assert math.isnan(next(r for r in report.results if r.request_id == "shed").ttft)


def test_unknown_pod_from_router_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown pod"):
        run_cluster_sim([PodConfig(name="a")], [sim_request("r", 0.0, "x")], lambda r, p, n: "b")


def test_pd_pairs_and_prefix_reuse_on_the_prefill_pod() -> None:
    pods = [PodConfig(name="p0", role="prefill"), *(PodConfig(name=f"d{i}", role="decode") for i in range(2))]
    prompt = text_tokens(2048, "s")
    wl = [sim_request(f"r{i}", i * 1.0, prompt, max_tokens=16) for i in range(4)]
    report = run_cluster_sim(pods, wl, lambda r, p, n: ("p0", "d0" if int(r.request_id[1:]) % 2 else "d1"))
    assert report.completed == 4
    assert {r.prefill_pod for r in report.results} == {"p0"} and {r.pod for r in report.results} == {"d0", "d1"}
    assert [r.cached_tokens for r in report.results] == [0, 2032, 2032, 2032]
    assert report.results[1].ttft < report.results[0].ttft
    assert report.pods[1].requests == 2 and report.pods[0].requests == 4


@pytest.mark.parametrize("pd", [False, True], ids=["one pod", "P/D pair"])
def test_first_token_is_reported_when_it_is_produced(pd: bool) -> None:
    """on_first_token fires once per request, at the client's first-token time, naming the pod
    that streams it (the decode pod under P/D); before the completion."""
    events: list[tuple[str, str, str, float]] = []
    pods = [PodConfig(name="p0", role="prefill"), PodConfig(name="d0", role="decode")] if pd else [PodConfig(name="a")]
    wl = [sim_request(f"r{i}", i * 0.05, text_tokens(512, f"s{i}"), max_tokens=8) for i in range(3)]
    report = run_cluster_sim(
        pods,
        wl,
        lambda r, p, n: ("p0", "d0") if pd else "a",
        on_complete=lambda r, pod, res: events.append(("done", r.request_id, pod or "", res.arrival + res.e2e)),
        on_first_token=lambda r, pod, now: events.append(("first", r.request_id, pod, now)),
    )  # fmt: skip
    assert report.completed == 3
    for res in report.results:
        mine = [e for e in events if e[1] == res.request_id]
        assert [e[0] for e in mine] == ["first", "done"]
        assert mine[0][2] == ("d0" if pd else "a")
        assert mine[0][3] == pytest.approx(res.arrival + res.ttft)


def test_report_summary_and_percentiles() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 50) == 3.0
    assert percentile([1.0, 2.0], 90) == pytest.approx(1.9)
    assert math.isnan(percentile([], 50))
    wl = generate_workload(num_requests=100, rate=20, lora_adapters=["a", "b"], lora_fraction=0.5, seed=5)
    report = run_cluster_sim(make_pod_configs(2, lora_adapters=["a", "b"], max_loras=1), wl, BASELINES["random"]())
    s = report.summary()
    assert s["completed"] == 100 and s["lora_loads"] >= 2 and set(s["ttft_s"]) == {"p50", "p90", "p99", "mean", "max"}
    assert s["output_token_throughput"] == pytest.approx(report.output_tokens / report.duration)
    assert "ttft (ms)" in report.format()


def test_workload_generator_is_seeded_and_shaped() -> None:
    spec: dict[str, Any] = dict(num_requests=2000, rate=10, prefix_groups=4, prefix_tokens=64, prefix_zipf=1.0,
                                lora_adapters=["l0", "l1", "l2"], lora_fraction=0.5, seed=11)  # fmt: skip
    a, b = generate_workload(**spec), generate_workload(**spec)
    assert [(r.arrival_time, r.prompt, r.model) for r in a] == [(r.arrival_time, r.prompt, r.model) for r in b]
    assert [r.prompt for r in generate_workload(**{**spec, "seed": 12})] != [r.prompt for r in a]
    assert a[-1].arrival_time == pytest.approx(200, rel=0.1)  # Poisson at 10/s
    models = Counter(r.model for r in a)
    assert models["l0"] > models["l1"] > models["l2"] > 0 and 900 < models["meta-llama/Llama-3.1-8B-Instruct"] < 1100
    prefixes = Counter(r.prompt[:256] for r in a)
    assert len(prefixes) == 4 and max(prefixes.values()) > 2 * min(prefixes.values())
    chat = generate_workload(WorkloadSpec(num_requests=3, chat=True, prefix_groups=1, seed=1))
    assert chat[0].body["messages"][0]["role"] == "system" and chat[0].prompt_tokens > 1024


def test_ten_thousand_requests_on_32_pods_is_fast() -> None:
    wl = generate_workload(num_requests=10_000, rate=200, prefix_groups=16, prefix_tokens=512,
                           prompt_tokens=(64, 512), output_tokens=(16, 256), seed=1)  # fmt: skip
    report = run_cluster_sim(make_pod_configs(32), wl, BASELINES["power-of-two"]())
    assert report.completed == 10_000
    assert report.wall_time_s < 30


async def test_both_drivers_agree_on_cached_versus_uncached_ttft() -> None:
    """The same three requests through both drivers: the prefix hit is the fastest in both."""
    shared, other = text_tokens(3000, "c"), text_tokens(3000, "u")
    bodies = {"first": completion(shared, 2), "hit": completion(shared, 2), "miss": completion(other, 2)}
    wl = [SimRequest.from_body(rid, i * 1.0, body) for i, (rid, body) in enumerate(bodies.items())]
    virtual = {r.request_id: r for r in run_cluster_sim([PodConfig(name="a")], wl, lambda r, p, n: "a").results}
    real: dict[str, tuple[float, int]] = {}
    async with SimCluster([PodConfig(name="a")], time_scale=1.0) as c, aiohttp.ClientSession() as s:
        for rid, body in bodies.items():
            ttft, usage = await stream_ttft(s, c.pods[0].url, body)
            real[rid] = (ttft, usage["prompt_tokens_details"]["cached_tokens"])
    for rid in bodies:
        assert virtual[rid].cached_tokens == real[rid][1], rid
    assert virtual["hit"].ttft < virtual["first"].ttft and virtual["hit"].ttft < virtual["miss"].ttft
    assert real["hit"][0] < real["first"][0] and real["hit"][0] < real["miss"][0]
    assert sorted(bodies, key=lambda k: virtual[k].ttft)[0] == sorted(bodies, key=lambda k: real[k][0])[0]


def test_adapters_are_not_served_without_lora_slots() -> None:
    pods = [PodConfig(name="a", max_loras=0, lora_adapters=["l"])]
    report = run_cluster_sim(pods, [sim_request("r", 0.0, "x", model="l")], lambda r, p, n: "a")
    assert report.rejected == 1
