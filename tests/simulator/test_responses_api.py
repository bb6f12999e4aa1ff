"""The simulator's Responses API with the official `openai` SDK: a per-pod store (a follow-up a
pod did not make is its 404), streamed events by their Responses names, retrieve and delete."""

from __future__ import annotations

import asyncio

import openai
import pytest

from ray_epp.simulator import DEFAULT_MODEL, PodConfig, SimCluster


async def test_conversation_is_kept_per_pod_and_a_stranger_is_404() -> None:
    async with SimCluster([PodConfig(name="a"), PodConfig(name="b")], time_scale=0) as c:
        a = openai.AsyncOpenAI(base_url=c.pods[0].url + "/v1", api_key="x")
        b = openai.AsyncOpenAI(base_url=c.pods[1].url + "/v1", api_key="x")
        first = await a.responses.create(model=DEFAULT_MODEL, input="hello there", instructions="be brief",
                                         max_output_tokens=5)  # fmt: skip
        assert first.status == "completed" and first.output_text and first.usage.output_tokens == 5
        second = await a.responses.create(model=DEFAULT_MODEL, input=[{"role": "user", "content": "and then?"}],
                                          previous_response_id=first.id, max_output_tokens=3)  # fmt: skip
        assert second.usage.input_tokens > first.usage.input_tokens  # the history is part of the prompt
        with pytest.raises(openai.NotFoundError, match=first.id):
            await b.responses.create(model=DEFAULT_MODEL, input="x", previous_response_id=first.id)
        assert (await a.responses.retrieve(first.id)).id == first.id
        await a.responses.delete(first.id)
        with pytest.raises(openai.NotFoundError):
            await a.responses.retrieve(first.id)


async def test_streamed_response_uses_the_responses_events() -> None:
    async with SimCluster([PodConfig(name="a")], time_scale=0) as c:
        client = openai.AsyncOpenAI(base_url=c.pods[0].url + "/v1", api_key="x")
        stream = await client.responses.create(model=DEFAULT_MODEL, input="hi", max_output_tokens=4, stream=True)
        events = [event async for event in stream]
        kinds = [e.type for e in events]
        assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
        deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert deltas == events[-1].response.output_text and len(deltas.split()) == 4
        follow = await client.responses.create(
            model=DEFAULT_MODEL, input="more", previous_response_id=events[-1].response.id
        )
        assert follow.previous_response_id == events[-1].response.id


async def test_bad_responses_bodies_are_400() -> None:
    async with SimCluster([PodConfig(name="a")], time_scale=0) as c:
        client = openai.AsyncOpenAI(base_url=c.pods[0].url + "/v1", api_key="x")
        with pytest.raises(openai.BadRequestError, match="input"):
            await client.responses.create(model=DEFAULT_MODEL, input=5)  # type: ignore[arg-type]
        with pytest.raises(openai.NotFoundError, match="model"):
            await client.responses.create(model="nope", input="x")


async def test_a_background_response_runs_on_and_may_be_cancelled() -> None:
    async with SimCluster([PodConfig(name="a")], time_scale=1.0) as c:
        client = openai.AsyncOpenAI(base_url=c.pods[0].url + "/v1", api_key="x")
        done = await client.responses.create(model=DEFAULT_MODEL, input="short", max_output_tokens=2, background=True)
        assert done.status == "queued"
        for _ in range(200):
            if (await client.responses.retrieve(done.id)).status == "completed":
                break
            await asyncio.sleep(0.02)
        assert (await client.responses.retrieve(done.id)).output_text
        with pytest.raises(openai.BadRequestError, match="synchronous"):
            await client.responses.cancel(done.id)
        long = await client.responses.create(model=DEFAULT_MODEL, input="long", max_output_tokens=2000,
                                             background=True)  # fmt: skip
        assert (await client.responses.cancel(long.id)).status == "cancelled"
        assert (await client.responses.retrieve(long.id)).status == "cancelled"
        with pytest.raises(openai.NotFoundError):
            await client.responses.cancel("resp_unknown")
        with pytest.raises(openai.BadRequestError, match="background"):
            await client.responses.create(model=DEFAULT_MODEL, input="x", background=True, store=False)
