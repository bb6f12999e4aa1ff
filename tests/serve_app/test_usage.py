"""The token usage the gateway reads for `ResponseUsage` plugins, from a simulated vLLM pod's real
answers over HTTP: a whole JSON body, a stream with `stream_options.include_usage`, and none from a
stream without it."""

from __future__ import annotations

import httpx
import pytest

from ray_epp.simulator import PodConfig, start_sim_pods_in_thread
from serve_app.gateway.usage import (
    STREAM_HEAD_BYTES,
    STREAM_TAIL_BYTES,
    usage_counts_of_body,
    usage_counts_of_stream,
    usage_of_body,
    usage_of_stream,
)

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.fixture(scope="module")
def url():
    with start_sim_pods_in_thread([PodConfig(name="usage-0")]) as cluster:
        yield f"http://127.0.0.1:{cluster.pods[0].port}"


def test_a_whole_body_gives_its_usage(url):
    body = {"model": MODEL, "prompt": "count the tokens of this prompt", "max_tokens": 7}
    resp = httpx.post(url + "/v1/completions", json=body, timeout=30)
    prompt, completion = usage_of_body(resp.content)
    assert prompt > 0 and completion == resp.json()["usage"]["completion_tokens"] > 0


def test_a_stream_gives_its_usage_only_when_asked_for(url):
    def tail(extra: dict) -> bytes:
        body = {"model": MODEL, "prompt": "stream me", "max_tokens": 40, "stream": True, **extra}
        out = b""
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as resp:
            for chunk in resp.iter_raw():
                out = (out + chunk)[-STREAM_TAIL_BYTES:]
        return out

    usage = usage_of_stream(tail({"stream_options": {"include_usage": True}}))
    assert usage is not None and usage[0] > 0 and usage[1] > 0
    assert usage_of_stream(tail({})) is None
    assert usage_of_body(b"not json") is None


def test_the_counts_carry_the_cached_prompt_tokens_when_the_server_reports_them(url):
    body = {"model": MODEL, "prompt": "the same prompt twice, the second time from the cache " * 8, "max_tokens": 3}
    for _ in range(2):
        resp = httpx.post(url + "/v1/completions", json=body, timeout=30)
    usage = resp.json()["usage"]
    assert usage_counts_of_body(resp.content) == (
        usage["prompt_tokens"],
        usage["completion_tokens"],
        usage["prompt_tokens_details"]["cached_tokens"],
    )
    assert usage["prompt_tokens_details"]["cached_tokens"] > 0
    without = b'{"usage": {"prompt_tokens": 5, "completion_tokens": 2}}'
    assert usage_counts_of_body(without) == (5, 2, -1)  # not reported: -1, and no cached-token sample


def test_responses_and_anthropic_usage_count_the_same_tokens(url):
    body = {"model": MODEL, "input": "the Responses API names its tokens otherwise", "max_output_tokens": 4}
    whole = httpx.post(url + "/v1/responses", json=body, timeout=30)
    usage = whole.json()["usage"]
    assert usage_counts_of_body(whole.content) == (
        usage["input_tokens"],
        4,
        usage["input_tokens_details"]["cached_tokens"],
    )
    with httpx.stream("POST", url + "/v1/responses", json={**body, "stream": True}, timeout=30) as resp:
        tail = b"".join(resp.iter_raw())[-STREAM_TAIL_BYTES:]
    assert usage_of_stream(tail) == (usage["input_tokens"], 4)  # its response.completed event
    message = {"model": MODEL, "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}
    answer = httpx.post(url + "/v1/messages", json=message, timeout=30)
    assert usage_of_body(answer.content) == (answer.json()["usage"]["input_tokens"], 3)


def test_an_anthropic_streams_usage_is_its_start_and_its_last_delta(url):
    """message_start carries the input tokens, the last message_delta the output (and, in newer
    streams, the input again): together they make the usage, however far apart in a long stream."""
    message = {"model": MODEL, "max_tokens": 200, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    with httpx.stream("POST", url + "/v1/messages", json=message, timeout=30) as resp:
        data = b"".join(resp.iter_raw())
    read = httpx.post(url + "/v1/messages/count_tokens", json=message, timeout=30).json()["input_tokens"]
    assert len(data) > 2 * STREAM_TAIL_BYTES  # the start is not in the tail
    head, tail = data[:STREAM_HEAD_BYTES], data[-STREAM_TAIL_BYTES:]
    counts = usage_counts_of_stream(tail, head)
    assert counts is not None and counts[:2] == (read, 200)
    # a delta with the output alone (Anthropic's older streams): the input comes from message_start
    output_only = (b'event: message_delta\ndata: {"type": "message_delta", "delta": {"stop_reason": "max_tokens"}, '
                   b'"usage": {"output_tokens": 200}}\n\n')  # fmt: skip
    assert usage_counts_of_stream(output_only, head)[:2] == (read, 200)
    assert usage_counts_of_stream(output_only) is None  # without its start, it does not say what was read
