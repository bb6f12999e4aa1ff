"""The end-to-end driver's `--api`: the agentic workload's chat requests sent over the Responses
API (each later turn chained by `previous_response_id`, so a turn that reached a pod without the
conversation would fail) and Anthropic Messages, to a simulated pod, read back in each API's own
stream events."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from bench.api_shapes import StreamReader, api_of, request
from bench.metrics import OK
from bench.replay_client import replay
from bench.workloads import AgenticSpec, agentic_workload
from ray_epp.simulator import PodConfig, start_sim_pods_in_thread

SMALL = AgenticSpec(num_requests=12, agent_types=2, system_tokens=200, task_tokens=20, min_turns=2, max_turns=3,
                    tool_call_tokens=(3, 6), tool_result_tokens=(10, 30), final_answer_tokens=(5, 8),
                    long_context_share=0.0, tool_time_s=0.05, nominal_itl_s=0.001)  # fmt: skip


def test_each_api_carries_the_same_conversation():
    turns = [r for r in agentic_workload(0, 0, SMALL) if r.headers["x-session-id"] == "s0-1"]
    first, second = turns[0], turns[1]
    path, body = request("responses", first)
    assert path == "/v1/responses" and body["instructions"].startswith("[agent") and len(body["input"]) == 1
    path, body = request("responses", second, (first, "resp_1"))
    assert body["previous_response_id"] == "resp_1" and [i["role"] for i in body["input"]] == ["user"]  # the tool's
    path, body = request("messages", second)
    assert path == "/v1/messages" and [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    assert body["max_tokens"] == second.body["max_tokens"] and body["system"] == first.body["messages"][0]["content"]
    assert request("chat", second)[0] == "/v1/chat/completions"
    more = agentic_workload(0, 0, dataclasses.replace(SMALL, num_requests=60))
    assert {api_of("mixed", r) for r in more} == {"chat", "responses", "messages"}
    reader = StreamReader("messages")
    reader.feed({"type": "message_start", "message": {"usage": {"input_tokens": 9, "cache_read_input_tokens": 4}}})
    reader.feed({"type": "message_delta", "usage": {"output_tokens": 3}})
    assert reader.counts() == (9, 3, 4)


@pytest.mark.parametrize("api", ["chat", "responses", "messages", "mixed"])
def test_the_agentic_workload_runs_over_each_api(api: str):
    workload = agentic_workload(0, 0, SMALL)
    with start_sim_pods_in_thread([PodConfig(name="a")], time_scale=0.05) as cluster:
        url = f"http://127.0.0.1:{cluster.pods[0].port}"
        outcomes, _ = asyncio.run(replay([url], workload, 0.05, 20.0, 0, api=api))
    assert all(o.status == OK for o in outcomes), [(o.reason, o.detail) for o in outcomes if o.status != OK]
    by_id = {r.request_id: r for r in workload}
    assert all(o.output_tokens == by_id[o.request_id].max_tokens and o.prompt_tokens > 0 for o in outcomes)
    later = [o for o in outcomes if by_id[o.request_id].body["messages"][-1]["role"] == "tool"]
    assert later and all(o.cached_tokens > 0 for o in later)  # each later turn finds its conversation cached
