"""The simulator's Anthropic Messages API with the official `anthropic` SDK: `system`, streamed
text, tools (a forced tool call, then its result), count_tokens, errors in Anthropic's shape."""

from __future__ import annotations

import anthropic
import pytest

from ray_epp.simulator import DEFAULT_MODEL, PodConfig, SimCluster

WEATHER = {"name": "get_weather", "description": "weather", "input_schema": {"type": "object", "properties": {}}}


async def test_messages_text_tools_and_count_tokens() -> None:
    async with SimCluster([PodConfig(name="a")], time_scale=0) as c:
        client = anthropic.AsyncAnthropic(base_url=c.pods[0].url, api_key="x")
        out = await client.messages.create(model=DEFAULT_MODEL, max_tokens=5, system="be brief",
                                           messages=[{"role": "user", "content": "hello"}])  # fmt: skip
        assert out.content[0].type == "text" and len(out.content[0].text.split()) == 5
        assert out.stop_reason == "max_tokens" and out.usage.output_tokens == 5
        call = await client.messages.create(model=DEFAULT_MODEL, max_tokens=5, tools=[WEATHER],
                                            tool_choice={"type": "any"},
                                            messages=[{"role": "user", "content": "weather?"}])  # fmt: skip
        assert call.stop_reason == "tool_use" and call.content[0].name == "get_weather"
        result = [{"type": "tool_result", "tool_use_id": call.content[0].id, "content": "sunny"}]
        turns = [{"role": "user", "content": "weather?"}, {"role": "assistant", "content": call.content},
                 {"role": "user", "content": result}]  # fmt: skip
        answer = await client.messages.create(model=DEFAULT_MODEL, max_tokens=3, tools=[WEATHER], messages=turns)
        assert answer.content[0].type == "text"
        count = await client.messages.count_tokens(model=DEFAULT_MODEL, messages=turns, tools=[WEATHER])
        assert count.input_tokens > 0


async def test_streamed_messages_use_anthropics_events() -> None:
    async with SimCluster([PodConfig(name="a")], time_scale=0) as c:
        client = anthropic.AsyncAnthropic(base_url=c.pods[0].url, api_key="x")
        async with client.messages.stream(model=DEFAULT_MODEL, max_tokens=4,
                                          messages=[{"role": "user", "content": "hi"}]) as stream:  # fmt: skip
            text = "".join([t async for t in stream.text_stream])
            final = await stream.get_final_message()
        assert len(text.split()) == 4 and final.content[0].text == text and final.stop_reason == "max_tokens"
        async with client.messages.stream(model=DEFAULT_MODEL, max_tokens=4, tools=[WEATHER],
                                          tool_choice={"type": "tool", "name": "get_weather"},
                                          messages=[{"role": "user", "content": "hi"}]) as stream:  # fmt: skip
            final = await stream.get_final_message()
        assert final.content[0].type == "tool_use" and final.stop_reason == "tool_use"


async def test_errors_are_in_anthropics_shape() -> None:
    async with SimCluster([PodConfig(name="a")], time_scale=0) as c:
        client = anthropic.AsyncAnthropic(base_url=c.pods[0].url, api_key="x", max_retries=0)
        with pytest.raises(anthropic.BadRequestError) as err:
            await client.messages.create(model=DEFAULT_MODEL, max_tokens=5, messages=[])
        assert err.value.body["type"] == "error" and err.value.body["error"]["type"] == "invalid_request_error"
        with pytest.raises(anthropic.NotFoundError):
            await client.messages.create(model="nope", max_tokens=5, messages=[{"role": "user", "content": "x"}])
