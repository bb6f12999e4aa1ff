"""The end-to-end peers of the SMG/llm-d/Dynamo table: the real SMG (`smg launch`, cache_aware)
and Dynamo's selection core behind bench/dynamo_forwarder.py, each in front of two simulated pods
in their own process; llm-d's config is our gateway with bench/configs/llmd-sticky-until-saturated.yaml."""

import json
from pathlib import Path

import pytest

from bench.dynamo_forwarder import prompt_of, workers_of
from bench.e2e import NEEDS_KV_EVENTS, TARGETS, E2EDriver, TargetUnavailable, installed, target, unavailable
from bench.metrics import OK
from bench.routing_peers import from_sweeps, tables_from
from ray_epp.simulator import make_pod_configs

from .helpers import SYSTEM, req

GROUPS = {"a": "Answer as a lawyer would. " + SYSTEM * 2, "b": "Answer as a chemist would. " + SYSTEM * 2}
ORDER = ["a", "a", "b", "b", "a", "b", "a", "b"]  # round-robin over two pods would miss a's and b's second turn


@pytest.mark.parametrize("peer", ["smg-cache-aware", "dynamo-kv"])
def test_a_peer_sends_each_prefix_back_where_it_was_computed(peer: str) -> None:
    """One request at a time (0.4 s of model time apart, each done in ~0.2 s): after a group's
    first request every one finds its system prompt cached, which only a router that knows where
    it went (SMG's text tree) or reads the pods' KV events (Dynamo's indexer) can do."""
    if not installed(peer):
        pytest.skip(f"{unavailable(peer)}")
    workload = [req(f"r{i}-{g}", GROUPS[g] + f" Question {i}?", t=0.4 * i) for i, g in enumerate(ORDER)]
    run = E2EDriver(time_scale=0.5, max_requests=len(workload), timeout_s=30, warmup=2).run(
        peer, make_pod_configs(2), workload, 0
    )
    assert all(o.status == OK for o in run.outcomes), run.extra
    system_tokens = len(GROUPS["a"]) // 4 // 16 * 16
    first = {o.request_id for o in run.outcomes if o.request_id in ("r0-a", "r2-b")}
    for o in run.outcomes:
        if o.request_id in first:
            assert o.cached_tokens < system_tokens, o
        else:
            assert o.cached_tokens >= system_tokens - 16, o  # the block the question starts in may differ


def test_dynamo_kv_needs_the_pods_kv_events() -> None:
    assert "dynamo-kv" in NEEDS_KV_EVENTS
    silent = [{"name": "sim-0", "address": "127.0.0.1", "port": 8100}]
    with pytest.raises(ValueError, match="publishes no KV events"):
        workers_of(silent)
    loud = [{**silent[0], "kvEvents": {"endpoint": "tcp://127.0.0.1:5557", "replay": "tcp://127.0.0.1:5558"}}]
    (worker,) = workers_of(loud)
    assert worker["endpoint"] == "http://127.0.0.1:8100" and worker["kv_events_endpoint"] == "tcp://127.0.0.1:5557"


def test_the_forwarder_tokenizes_as_the_pods_do() -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert prompt_of({"messages": messages}).startswith("<|begin_of_text|><|start_header_id|>system")
    assert prompt_of({"prompt": [1, 2, 3]}) == [1, 2, 3]
    with pytest.raises(ValueError, match="neither messages nor a prompt"):
        prompt_of({"input": "hi"})


def test_llmd_config_is_our_gateway_with_it() -> None:
    make = target("epp-llmd-sticky-until-saturated")
    assert make is not None
    spec = make(["http://127.0.0.1:1"], Path("pods.json"), 9)
    assert spec is not None
    cmd, ready, _ = spec
    assert cmd[cmd.index("--config") + 1].endswith("bench/configs/llmd-sticky-until-saturated.yaml")
    assert ready == "http://127.0.0.1:9/ready"


def test_a_missing_peer_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(TARGETS, "dynamo-kv", lambda workers, pods_json, port: None)
    with pytest.raises(TargetUnavailable, match=r"ai-dynamo-runtime==1\.6\.1"):
        E2EDriver(max_requests=1).run("dynamo-kv", make_pod_configs(1), [req("r0", "hello")], 0)


def test_the_peer_table_reads_epp_bench_results(tmp_path: Path) -> None:
    def run(policy: str, p90: float) -> dict:
        ttft = {"p50": p90 / 2, "p90": p90, "p99": p90 * 2}
        metrics = {"ttft_ms": ttft, "output_throughput": 100.0, "prefix_hit_rate": 0.5}
        return {"policy": policy, "fraction": 0.9, "rate": 45.0, "metrics": metrics}

    for seed, ours in ((0, 90.0), (1, 110.0)):
        runs = [run("epp-default", ours), run("smg-cache-aware", 100.0), run("dynamo-kv", 200.0)]
        (tmp_path / f"s{seed}.json").write_text(json.dumps({"scenario": "agentic", "seed": seed, "runs": runs}))
    merged = from_sweeps([str(tmp_path / "s0.json"), str(tmp_path / "s1.json")])
    assert set(merged["agentic@0.90"]["smg-cache-aware"]) == {"0", "1"}
    text = tables_from(merged, "epp-default")
    assert "### agentic@0.90 (2 seeds)" in text
    assert "| epp-default | 50.0 | 100.0 | 200.0 | 100 | 0.500 | 1.000 ± 0.000 | 1.000 ± 0.100 |" in text
