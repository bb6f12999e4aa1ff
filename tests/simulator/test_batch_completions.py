"""Completions as vLLM accepts them, with the official `openai` SDK: a batch of prompts (strings
or token lists), `n` choices per prompt in vLLM's order, usage counting each prompt once, and a
streamed batch with `stream_options.include_usage`."""

from __future__ import annotations

import openai
import pytest

from ray_epp.simulator import DEFAULT_MODEL, PodConfig, SimCluster


async def test_a_batch_of_prompts_with_n_choices_each() -> None:
    async with SimCluster([PodConfig(name="a")], time_scale=0) as c:
        client = openai.AsyncOpenAI(base_url=c.pods[0].url + "/v1", api_key="x")
        out = await client.completions.create(model=DEFAULT_MODEL, prompt=["abcd" * 5, "efgh" * 10], max_tokens=3, n=2)
        assert [ch.index for ch in out.choices] == [0, 1, 2, 3]
        assert all(len(ch.text.split()) == 3 for ch in out.choices) and out.choices[0].text != out.choices[1].text
        assert out.usage.prompt_tokens == 5 + 10 and out.usage.completion_tokens == 12
        tokens = await client.completions.create(model=DEFAULT_MODEL, prompt=[[1, 2, 3], [4, 5]], max_tokens=2)
        assert len(tokens.choices) == 2 and tokens.usage.prompt_tokens == 5


async def test_a_streamed_batch_names_each_choice_and_ends_with_usage() -> None:
    async with SimCluster([PodConfig(name="a")], time_scale=0) as c:
        client = openai.AsyncOpenAI(base_url=c.pods[0].url + "/v1", api_key="x")
        stream = await client.completions.create(model=DEFAULT_MODEL, prompt=["one two", "three four"], max_tokens=4,
                                                 n=2, stream=True, stream_options={"include_usage": True})  # fmt: skip
        texts: dict[int, str] = {}
        usage = None
        async for chunk in stream:
            for ch in chunk.choices:
                texts[ch.index] = texts.get(ch.index, "") + ch.text
            usage = chunk.usage or usage
        assert sorted(texts) == [0, 1, 2, 3] and all(len(t.split()) == 4 for t in texts.values())
        assert usage is not None and usage.completion_tokens == 16
        chat = await client.chat.completions.create(model=DEFAULT_MODEL, n=3, max_tokens=2,
                                                    messages=[{"role": "user", "content": "hi"}])  # fmt: skip
        assert [ch.index for ch in chat.choices] == [0, 1, 2]


async def test_an_empty_batch_is_a_400() -> None:
    async with SimCluster([PodConfig(name="a")], time_scale=0) as c:
        client = openai.AsyncOpenAI(base_url=c.pods[0].url + "/v1", api_key="x")
        with pytest.raises(openai.BadRequestError, match="prompt"):
            await client.completions.create(model=DEFAULT_MODEL, prompt=[], max_tokens=2)


async def test_logprobs_are_given_per_token_and_best_of_is_refused_as_vllm_v1_does() -> None:
    async with SimCluster([PodConfig(name="a")], time_scale=0) as c:
        client = openai.AsyncOpenAI(base_url=c.pods[0].url + "/v1", api_key="x")
        out = await client.completions.create(model=DEFAULT_MODEL, prompt="hi", max_tokens=3, logprobs=2, best_of=1)
        lp = out.choices[0].logprobs
        assert "".join(lp.tokens) == out.choices[0].text and len(lp.token_logprobs) == 3
        assert lp.text_offset[0] == 0 and all(len(top) == 2 for top in lp.top_logprobs)
        stream = await client.completions.create(model=DEFAULT_MODEL, prompt="hi", max_tokens=5, logprobs=0,
                                                 stream=True)  # fmt: skip
        pieces = [ch.choices[0] async for ch in stream if ch.choices]
        offsets = [o for p in pieces for o in p.logprobs.text_offset]
        text = "".join(p.text for p in pieces)
        assert [text[o:].split()[0] for o in offsets] == text.split()  # each offset starts its token
        with pytest.raises(openai.BadRequestError, match="best_of"):
            await client.completions.create(model=DEFAULT_MODEL, prompt="hi", max_tokens=3, best_of=3)
