"""The simulator's non-generating APIs with the official `openai` SDK where it has them:
embeddings (float and base64, deterministic), pooling, classify, score, rerank, detokenize."""

from __future__ import annotations

import aiohttp
import openai
import pytest

from ray_epp.simulator import DEFAULT_MODEL, PodConfig, SimCluster


async def test_embeddings_are_deterministic_unit_vectors() -> None:
    async with SimCluster([PodConfig(name="a", lora_adapters=["sql"])], time_scale=0) as c:
        client = openai.AsyncOpenAI(base_url=c.pods[0].url + "/v1", api_key="x")
        out = await client.embeddings.create(model=DEFAULT_MODEL, input=["alpha", "beta", "alpha"])  # base64
        vecs = [d.embedding for d in out.data]
        assert len(vecs) == 3 and vecs[0] == pytest.approx(vecs[2]) and vecs[0] != vecs[1]
        assert sum(x * x for x in vecs[0]) == pytest.approx(1.0, rel=1e-5)
        floats = await client.embeddings.create(model="sql", input="alpha", encoding_format="float", dimensions=8)
        assert len(floats.data[0].embedding) == 8 and floats.usage.prompt_tokens == 2
        with pytest.raises(openai.NotFoundError):
            await client.embeddings.create(model="nope", input="x")
        with pytest.raises(openai.BadRequestError):
            await client.embeddings.create(model=DEFAULT_MODEL, input=[])


async def test_pooling_classify_score_rerank_and_detokenize() -> None:
    async with SimCluster([PodConfig(name="a")], time_scale=0) as c, aiohttp.ClientSession() as s:
        url = c.pods[0].url

        async def post(path: str, body: dict) -> tuple[int, dict]:
            async with s.post(url + path, json={"model": DEFAULT_MODEL, **body}) as r:
                return r.status, await r.json()

        status, out = await post("/pooling", {"input": "x y"})
        assert status == 200 and len(out["data"][0]["data"]) == 32
        status, out = await post("/classify", {"input": ["good", "bad"]})
        assert status == 200 and [d["num_classes"] for d in out["data"]] == [2, 2]
        status, out = await post("/score", {"text_1": "q", "text_2": ["a", "b"]})
        assert status == 200 and len(out["data"]) == 2 and all(0 <= d["score"] <= 1 for d in out["data"])
        status, out = await post("/v1/rerank", {"query": "q", "documents": ["a", "b", "c"], "top_n": 2})
        assert status == 200 and len(out["results"]) == 2
        assert out["results"][0]["relevance_score"] >= out["results"][1]["relevance_score"]
        status, tok = await post("/tokenize", {"prompt": "hello world!"})
        status, out = await post("/detokenize", {"tokens": tok["tokens"]})
        assert status == 200 and out["prompt"] == "hello world!"
        status, out = await post("/score", {"text_1": ["a", "b"], "text_2": ["c", "d", "e"]})
        assert status == 400 and out["error"]["param"] == "text_2"
        status, out = await post("/v2/rerank", {"query": "q", "documents": []})
        assert status == 400 and out["error"]["param"] == "documents"
