"""The HTTP driver over real sockets on 127.0.0.1: vLLM's OpenAI surface, metrics, P/D, failures."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ray_epp.simulator import DEFAULT_MODEL, POD_HEADER, FailureConfig, PodConfig, SimCluster

from .helpers import completion, stream_ttft, text_tokens


def families(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


async def get_metrics(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with session.get(url + "/metrics") as resp:
        assert resp.status == 200
        return families(await resp.text())


def value(fams: dict[str, Any], name: str, suffix: str = "") -> float:
    return next(s.value for s in fams[name].samples if s.name == name + suffix)


async def test_completion_chat_and_models() -> None:
    cfg = PodConfig(name="a", lora_adapters=["sql"])
    async with SimCluster([cfg], time_scale=0) as c, aiohttp.ClientSession() as s:
        url = c.pods[0].url
        async with s.post(url + "/v1/completions", json=completion("hello " * 40, max_tokens=7)) as r:
            assert r.status == 200 and r.headers[POD_HEADER] == "a"
            out = await r.json()
        assert out["object"] == "text_completion" and out["choices"][0]["finish_reason"] == "length"
        assert out["usage"]["completion_tokens"] == 7 and len(out["choices"][0]["text"].split()) == 7
        assert out["usage"]["prompt_tokens"] == 60 and out["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        chat = {"model": "sql", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                "max_completion_tokens": 3, "some_router_field": {"x": 1}}  # fmt: skip
        async with s.post(url + "/v1/chat/completions", json=chat) as r:
            assert r.status == 200
            out = await r.json()
        assert out["object"] == "chat.completion" and out["choices"][0]["message"]["role"] == "assistant"
        assert out["usage"]["completion_tokens"] == 3
        async with s.get(url + "/v1/models") as r:
            models = await r.json()
        ids = {m["id"]: m for m in models["data"]}
        assert set(ids) == {DEFAULT_MODEL, "sql"} and ids["sql"]["parent"] == DEFAULT_MODEL


@pytest.mark.parametrize("chat", [False, True])
async def test_streaming_with_usage(chat: bool) -> None:
    async with SimCluster([PodConfig(name="a")], time_scale=0) as c, aiohttp.ClientSession() as s:
        body: dict[str, Any] = {"model": DEFAULT_MODEL, "max_tokens": 5, "stream": True,
                                "stream_options": {"include_usage": True}}  # fmt: skip
        if chat:
            body["messages"] = [{"role": "user", "content": "hello"}]
        else:
            body["prompt"] = "hello"
        path = "/v1/chat/completions" if chat else "/v1/completions"
        async with s.post(c.pods[0].url + path, json=body) as r:
            assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
            lines = [ln.decode().strip() async for ln in r.content if ln.strip()]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(ln[6:]) for ln in lines[:-1]]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5
    content = [ch["choices"][0] for ch in chunks[:-1]]
    texts = [ch["delta"].get("content", "") if chat else ch["text"] for ch in content]
    assert len([t for t in texts if t]) == 5
    assert content[-1]["finish_reason"] == "length" and all(ch["finish_reason"] is None for ch in content[:-1])


async def test_metrics_parse_with_vllm_names_and_labels() -> None:
    cfg = PodConfig(name="a", lora_adapters=["l1"], max_loras=3)
    async with SimCluster([cfg], time_scale=0) as c, aiohttp.ClientSession() as s:
        url = c.pods[0].url
        prompt = text_tokens(300, "m")
        for _ in range(2):
            async with s.post(url + "/v1/completions", json=completion(prompt, 3)) as r:
                assert r.status == 200
        fams = await get_metrics(s, url)
    names = ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
             "vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:prompt_tokens", "vllm:generation_tokens",
             "vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds"]  # fmt: skip
    for name in names:
        assert fams[name].samples[0].labels["model_name"] == DEFAULT_MODEL, name
    assert fams["vllm:time_to_first_token_seconds"].type == "histogram"
    assert value(fams, "vllm:time_to_first_token_seconds", "_count") == 2
    assert value(fams, "vllm:prefix_cache_queries", "_total") == 600
    assert value(fams, "vllm:prefix_cache_hits", "_total") == 288
    assert value(fams, "vllm:generation_tokens", "_total") == 6
    lora = fams["vllm:lora_requests_info"].samples[0]
    assert set(lora.labels) == {"running_lora_adapters", "waiting_lora_adapters", "max_lora"}
    assert lora.labels["max_lora"] == "3" and lora.value > 1.6e9  # a timestamp, as vLLM reports it
    cache = fams["vllm:cache_config_info"].samples[0].labels
    assert (cache["block_size"], cache["num_gpu_blocks"]) == ("16", "27000")


async def test_prefix_hit_lowers_ttft_over_http() -> None:
    async with SimCluster([PodConfig(name="a")], time_scale=1.0) as c, aiohttp.ClientSession() as s:
        url, prompt = c.pods[0].url, text_tokens(4000, "h")
        cold, cold_usage = await stream_ttft(s, url, completion(prompt, 1))
        warm, warm_usage = await stream_ttft(s, url, completion(prompt, 1))
    assert cold_usage["prompt_tokens_details"]["cached_tokens"] == 0
    assert warm_usage["prompt_tokens_details"]["cached_tokens"] == 3984
    assert cold > 0.1 and warm < cold / 2  # model: ~126 ms cold vs ~7 ms warm


async def test_chat_stream_sends_its_role_chunk_with_the_first_token() -> None:
    """As vLLM does: the first chunk of a streamed chat (the role) comes after the prefill, so a
    gateway timing the first chunk times the first token."""
    async with SimCluster([PodConfig(name="a")], time_scale=1.0) as c, aiohttp.ClientSession() as s:
        body = {"model": DEFAULT_MODEL, "stream": True, "max_tokens": 3,
                "messages": [{"role": "user", "content": text_tokens(4000, "r")}]}  # fmt: skip
        t0 = time.perf_counter()
        chunks: list[tuple[float, dict[str, Any]]] = []
        async with s.post(c.pods[0].url + "/v1/chat/completions", json=body) as resp:
            async for raw in resp.content:
                line = raw.decode().strip()
                if line.startswith("data: {"):
                    chunks.append((time.perf_counter() - t0, json.loads(line[6:])))
    role_at, role = chunks[0]
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert role_at > 0.1  # a 4,000-token prefill takes ~126 ms in the model
    assert chunks[1][1]["choices"][0]["delta"]["content"] and chunks[1][0] - role_at < 0.05


async def poll_metrics(session: aiohttp.ClientSession, url: str, ready: Any, timeout: float = 2.0) -> dict[str, Any]:
    """Scrape until `ready(families)` holds (requests take a moment to reach the server)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        fams = await get_metrics(session, url)
        if ready(fams) or loop.time() > deadline:
            return fams
        await asyncio.sleep(0.005)


async def test_queueing_raises_ttft_and_shows_in_metrics() -> None:
    async with SimCluster([PodConfig(name="a", max_num_seqs=1)], time_scale=1.0) as c, aiohttp.ClientSession() as s:
        url = c.pods[0].url
        tasks = [asyncio.create_task(stream_ttft(s, url, completion(text_tokens(20, f"q{i}"), 40))) for i in range(3)]
        fams = await poll_metrics(s, url, lambda f: value(f, "vllm:num_requests_waiting") == 2)
        ttfts = sorted(t for t, _ in await asyncio.gather(*tasks))
    assert value(fams, "vllm:num_requests_running") == 1 and value(fams, "vllm:num_requests_waiting") == 2
    assert ttfts[1] > ttfts[0] + 0.15 and ttfts[2] > ttfts[1] + 0.15  # each waits ~40 steps of ~6 ms


async def test_lora_slot_limit_over_http() -> None:
    cfg = PodConfig(name="a", max_loras=1, lora_adapters=["x", "y"])
    async with SimCluster([cfg], time_scale=1.0) as c, aiohttp.ClientSession() as s:
        url = c.pods[0].url

        def lora(f: dict[str, Any]) -> dict[str, str]:
            return f["vllm:lora_requests_info"].samples[0].labels

        first = asyncio.create_task(stream_ttft(s, url, completion("abc", 60, model="x")))
        await poll_metrics(s, url, lambda f: lora(f)["running_lora_adapters"] == "x")
        second = asyncio.create_task(stream_ttft(s, url, completion("def", 2, model="y")))
        info = lora(await poll_metrics(s, url, lambda f: lora(f)["waiting_lora_adapters"] == "y"))
        await first
        ttft_y, _ = await second
    assert (info["running_lora_adapters"], info["waiting_lora_adapters"]) == ("x", "y")
    assert ttft_y > 0.15  # waited for x's 60 tokens to finish before y could take the only slot


async def test_pd_handoff_over_http() -> None:
    pods = [PodConfig(name="pre", role="prefill"), PodConfig(name="dec", role="decode")]
    prompt = text_tokens(3000, "d")
    async with SimCluster(pods, time_scale=1.0) as c, aiohttp.ClientSession() as s:
        pre, dec = c.pods
        assert pre.labels["llm-d.ai/role"] == "prefill" and dec.info()["labels"]["llm-d.ai/role"] == "decode"
        body = completion(prompt, 1, kv_transfer_params={"do_remote_decode": True, "do_remote_prefill": False})
        async with s.post(pre.url + "/v1/completions", json=body) as r:
            assert r.status == 200
            out = await r.json()
        kvp = out["kv_transfer_params"]
        assert kvp["do_remote_prefill"] is True and kvp["do_remote_decode"] is False
        assert len(kvp["remote_block_ids"]) == 188 and kvp["remote_engine_id"] == pre.engine.engine_id
        assert (kvp["remote_host"], kvp["remote_port"]) == ("127.0.0.1", pre.port)
        decode_ttft, usage = await stream_ttft(s, dec.url, completion(prompt, 8, kv_transfer_params=kvp))
        plain_ttft, plain = await stream_ttft(s, dec.url, completion(text_tokens(3000, "e"), 8))
        fams = await get_metrics(s, dec.url)
    assert usage["completion_tokens"] == 8 and usage["prompt_tokens_details"]["cached_tokens"] == 2999
    assert plain["prompt_tokens_details"]["cached_tokens"] == 0
    assert decode_ttft < plain_ttft / 2  # ~16 ms of KV pull instead of ~96 ms of prefill
    assert value(fams, "vllm:prefix_cache_hits", "_total") == 0


@pytest.mark.parametrize("status", ["429", "500", "503"])
async def test_injected_http_errors(status: str) -> None:
    cfg = PodConfig(name="a", failures=FailureConfig(rate=1.0, types=[status]))
    async with SimCluster([cfg], time_scale=0) as c, aiohttp.ClientSession() as s:
        async with s.post(c.pods[0].url + "/v1/completions", json=completion("x")) as r:
            assert r.status == int(status) and r.headers[POD_HEADER] == "a"
            err = (await r.json())["error"]
        assert err["code"] == int(status) and err["message"]
        c.pods[0].set_failures({"rate": 0.0})
        async with s.post(c.pods[0].url + "/v1/completions", json=completion("x")) as r:
            assert r.status == 200


async def test_failure_rate_is_a_fraction() -> None:
    cfg = PodConfig(name="a", failures=FailureConfig(rate=0.5, types=["500"]))
    async with SimCluster([cfg], time_scale=0, seed=3) as c, aiohttp.ClientSession() as s:
        statuses = []
        for _ in range(60):
            async with s.post(c.pods[0].url + "/v1/completions", json=completion("x", 1)) as r:
                statuses.append(r.status)
    assert 15 < statuses.count(500) < 45 and statuses.count(200) == 60 - statuses.count(500)


async def test_connection_drop_mid_stream_and_before_reply() -> None:
    cfg = PodConfig(name="a", failures=FailureConfig(rate=1.0, types=["drop"]))
    async with SimCluster([cfg], time_scale=0) as c, aiohttp.ClientSession() as s:
        url = c.pods[0].url
        body = completion("x", 20, stream=True)
        got: list[str] = []
        with pytest.raises(aiohttp.ClientPayloadError):
            async with s.post(url + "/v1/completions", json=body) as r:
                assert r.status == 200
                async for ln in r.content:
                    if ln.strip():
                        got.append(ln.decode())
        assert 0 < len(got) < 20 and not any("[DONE]" in g for g in got)
        with pytest.raises(aiohttp.ServerDisconnectedError):
            async with s.post(url + "/v1/completions", json=completion("x", 5)) as r:
                await r.read()
        c.pods[0].set_failures(FailureConfig())
        async with s.post(url + "/v1/completions", json=completion("x", 5)) as r:
            assert r.status == 200  # still serving
        assert c.pods[0].engine.running == [] and c.pods[0].engine.kv.num_used == 0


async def test_garbage_and_slow_metrics() -> None:
    cfg = PodConfig(name="a", failures=FailureConfig(metrics_garbage_rate=1.0))
    async with SimCluster([cfg], time_scale=0) as c, aiohttp.ClientSession() as s:
        url = c.pods[0].url
        async with s.get(url + "/metrics") as r:
            text = await r.text()
        with pytest.raises(ValueError):
            families(text)
        c.pods[0].set_failures(FailureConfig(metrics_delay_s=0.5))
        with pytest.raises(asyncio.TimeoutError):
            async with s.get(url + "/metrics", timeout=aiohttp.ClientTimeout(total=0.15)) as r:
                await r.read()


async def test_startup_delay_makes_health_503() -> None:
    cfg = PodConfig(name="a", startup_delay_s=0.4)
    async with SimCluster([cfg], time_scale=1.0) as c, aiohttp.ClientSession() as s:
        url = c.pods[0].url
        async with s.get(url + "/health") as r:
            assert r.status == 503
        async with s.post(url + "/v1/completions", json=completion("x")) as r:
            assert r.status == 503
        await asyncio.sleep(0.5)
        async with s.get(url + "/health") as r:
            assert r.status == 200


BAD_INPUT = [
    ("malformed json", b'{"model": ', 400, None),
    ("json array", b"[1, 2]", 400, None),
    ("missing model", json.dumps({"prompt": "hi"}).encode(), 400, "model"),
    ("unknown model", json.dumps({"model": "gpt-9", "prompt": "hi"}).encode(), 404, "model"),
    ("missing prompt", json.dumps({"model": DEFAULT_MODEL}).encode(), 400, "prompt"),
    ("empty prompt", json.dumps({"model": DEFAULT_MODEL, "prompt": ""}).encode(), 400, "prompt"),
    ("max_tokens type", json.dumps({"model": DEFAULT_MODEL, "prompt": "hi", "max_tokens": "many"}).encode(), 400,
     "max_tokens"),
    ("max_tokens zero", json.dumps({"model": DEFAULT_MODEL, "prompt": "hi", "max_tokens": 0}).encode(), 400,
     "max_tokens"),
    ("stream type", json.dumps({"model": DEFAULT_MODEL, "prompt": "hi", "stream": "maybe"}).encode(), 400, "stream"),
    ("prompt too long", json.dumps({"model": DEFAULT_MODEL, "prompt": "x" * 4 * 300}).encode(), 400, "prompt"),
    ("prompt plus output too long", json.dumps({"model": DEFAULT_MODEL, "prompt": "x" * 4 * 200,
                                                "max_tokens": 100}).encode(), 400, "max_tokens"),
]  # fmt: skip


@pytest.mark.parametrize(("case", "raw", "status", "param"), BAD_INPUT, ids=[b[0] for b in BAD_INPUT])
async def test_bad_input_gets_openai_errors_and_the_server_keeps_serving(
    case: str, raw: bytes, status: int, param: str | None
) -> None:
    async with SimCluster([PodConfig(name="a", max_model_len=256)], time_scale=0) as c, aiohttp.ClientSession() as s:
        url = c.pods[0].url
        headers = {"Content-Type": "application/json"}
        async with s.post(url + "/v1/completions", data=raw, headers=headers) as r:
            assert r.status == status
            err = (await r.json())["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["code"] == status and err["message"]
        if param is not None:
            assert err["param"] == param
        async with s.post(url + "/v1/completions", json=completion("fine", 2)) as r:
            assert r.status == 200


async def test_bad_chat_messages() -> None:
    async with SimCluster([PodConfig(name="a")], time_scale=0) as c, aiohttp.ClientSession() as s:
        for messages in ("not a list", [], [{"content": "no role"}]):
            body = {"model": DEFAULT_MODEL, "messages": messages}
            async with s.post(c.pods[0].url + "/v1/chat/completions", json=body) as r:
                assert r.status == 400, messages
                assert (await r.json())["error"]["param"].startswith("messages")


async def test_load_and_unload_lora_adapters() -> None:
    async with SimCluster([PodConfig(name="a")], time_scale=0) as c, aiohttp.ClientSession() as s:
        url = c.pods[0].url

        async def post(path: str, body: dict[str, Any]) -> int:
            async with s.post(url + path, json=body) as r:
                return r.status

        async def model_ids() -> set[str]:
            async with s.get(url + "/v1/models") as r:
                return {m["id"] for m in (await r.json())["data"]}

        assert await post("/v1/completions", completion("x", model="new")) == 404
        assert await post("/v1/load_lora_adapter", {"lora_name": "new", "lora_path": "/p/new"}) == 200
        assert await post("/v1/load_lora_adapter", {"lora_name": "new", "lora_path": "/p/new"}) == 400
        assert "new" in await model_ids()
        assert await post("/v1/completions", completion("x", model="new")) == 200
        assert await post("/v1/unload_lora_adapter", {"lora_name": "new"}) == 200
        assert await post("/v1/unload_lora_adapter", {"lora_name": "new"}) == 404
        assert await post("/v1/load_lora_adapter", {"lora_path": "/p"}) == 400
        assert await model_ids() == {DEFAULT_MODEL}


async def test_token_id_prompts_and_streamed_prefill_params() -> None:
    async with SimCluster([PodConfig(name="a")], time_scale=0) as c, aiohttp.ClientSession() as s:
        url = c.pods[0].url
        ids = list(range(100))
        async with s.post(url + "/v1/completions", json=completion(ids, 2)) as r:  # type: ignore[arg-type]
            assert (await r.json())["usage"]["prompt_tokens"] == 100
        async with s.post(url + "/v1/completions", json=completion(ids, 2)) as r:  # type: ignore[arg-type]
            assert (await r.json())["usage"]["prompt_tokens_details"]["cached_tokens"] == 96
        body = completion("x" * 400, 1, stream=True, kv_transfer_params={"do_remote_decode": True})
        async with s.post(url + "/v1/completions", json=body) as r:
            lines = [x.decode().strip() async for x in r.content]
        chunks = [json.loads(ln[6:]) for ln in lines if ln.startswith("data: {")]
        assert chunks[-1]["choices"] == [] and chunks[-1]["kv_transfer_params"]["do_remote_prefill"] is True
        assert len(chunks[-1]["kv_transfer_params"]["remote_block_ids"]) == 7
