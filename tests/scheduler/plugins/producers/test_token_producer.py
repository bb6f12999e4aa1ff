"""`token-producer`: a local tokenizer.json and vLLM's /tokenize over HTTP (a real server on
127.0.0.1) give the engine's tokens; the prefix cache gives exactly the whole-prompt tokens while
tokenizing a hot prefix once; llm-d's tokenizer-over-HTTP samples load and route by real blocks;
what can not run (a model that would need a download) is a load-time error."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from bench.tokenizer_fixture import CORPUS, TokenizeServer, make_tokenizer
from ray_epp.kvevents import BlockStored, KVEventBatch
from scheduler import Scheduler
from scheduler.config import Placement, build_plugins, load_config, load_config_file
from scheduler.errors import ConfigError
from scheduler.plugins.producers.precise_prefix import PrecisePrefixCacheProducer
from scheduler.plugins.producers.token_producer import TokenProducer
from scheduler.plugins.support.prefix.precise_index import LIVE
from scheduler.plugins.support.token_cache import PrefixTokenCache
from scheduler.plugins.support.tokenized import request_tokens
from tests.scheduler.helpers import endpoint, request

FIXTURES = Path(__file__).parents[3] / "fixtures" / "llm-d"
SHARED = " ".join(CORPUS[:9])  # ~750 characters shared by every prompt below


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory) -> Path:
    return make_tokenizer(tmp_path_factory.mktemp("tok"))


def local_producer(path: Path, **params) -> TokenProducer:
    yaml = f"""
plugins:
- type: token-producer
  parameters: {{local: {{tokenizerPath: "{path}"}}, cacheChunkChars: 64}}
"""
    return Scheduler.from_config(load_config(yaml)).plugins["token-producer"]


def test_prefix_cache_tokens_equal_whole_prompt_tokens(tokenizer_json):
    tok = Tokenizer.from_file(str(tokenizer_json))
    producer = local_producer(tokenizer_json)
    prompts = [SHARED + tail for tail in (" What is a fox?", " Who routes requests?", "  double  spaces\n\nend")]
    for i, prompt in enumerate(prompts):
        got = producer.tokens(request(prompt=prompt, request_id=f"r{i}"))
        assert got == tok.encode(prompt).ids
    info = producer.info()
    assert info["misses"] == 1 and info["prefix_hits"] == 2
    again = producer.tokens(request(prompt=prompts[1], request_id="again"))
    assert again == tok.encode(prompts[1]).ids and producer.info()["hits"] == 1


def test_cuts_depend_only_on_the_text_before_them():
    cache = PrefixTokenCache(chunk_chars=16)
    a = cache.cuts("one two three four five six seven eight nine ten")
    b = cache.cuts("one two three four five six seven XXXXXXXXXXXXXXXXX")
    assert a[:1] == b[:1] and all(0 < c < 60 for c in a)


def test_local_chat_uses_the_chat_template(tokenizer_json):
    producer = local_producer(tokenizer_json)
    req = request(request_id="c1")
    req.body = {"model": "m", "messages": [{"role": "user", "content": "hello fox"}]}
    tok = Tokenizer.from_file(str(tokenizer_json))
    expected = tok.encode("<s><|user|>\nhello fox\n<|assistant|>\n", add_special_tokens=False).ids
    assert producer.tokens(req) == expected


def test_http_tokenize_against_a_real_server(tokenizer_json):
    tok = Tokenizer.from_file(str(tokenizer_json))
    with TokenizeServer(tokenizer_json) as server:
        yaml = f"""
plugins:
- type: token-producer
  parameters: {{modelName: m, vllm: {{url: "{server.url}", timeout: 2s}}, cacheChunkChars: 64}}
"""
        producer = Scheduler.from_config(load_config(yaml)).plugins["token-producer"]
        prompt = SHARED + " What is a fox?"
        assert producer.tokens(request(prompt=prompt, request_id="h1")) == tok.encode(prompt).ids
        assert producer.http.calls == 1  # a miss: the whole prompt
        other = SHARED + " Who routes?"
        assert producer.tokens(request(prompt=other, request_id="h2")) == tok.encode(other).ids
        assert producer.http.calls == 3  # a shared prefix seen twice: it, and the rest
        third = SHARED + " Why the fox?"
        assert producer.tokens(request(prompt=third, request_id="h2b")) == tok.encode(third).ids
        assert producer.http.calls == 4  # only the rest after the cached prefix
        assert server.requests[-1]["add_special_tokens"] is False
        chat = request(request_id="h3")
        chat.body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        assert producer.tokens(chat) == tok.encode("<s><|user|>\nhi\n<|assistant|>\n", add_special_tokens=False).ids
        assert server.requests[-1]["add_generation_prompt"] is True
        server.garbage = True
        assert producer.tokens(request(prompt="something new entirely", request_id="h4")) is None
        assert producer.info()["failures"] == 1
    # The server is gone: the request is not failed, its tokens are None.
    assert producer.tokens(request(prompt="and another new one", request_id="h5")) is None


@pytest.mark.parametrize(
    ("params", "expect"),
    [
        ("{local: {modelName: nobody/never-downloaded-model}}", "would need a download"),
        ("{local: {tokenizerPath: /nonexistent/tokenizer.json}}", "is not a file"),
        ("{vllm: {url: 'http://x:1'}}", "modelName is required"),
        ("{modelName: m, vllm: {url: 'ftp://x'}}", "not an http"),
        ("{modelName: m, vllm: {timeout: 0s}}", "positive duration"),
        ("{modelName: m, vllm: {}, local: {tokenizerPath: /x}}", "one backend"),
    ],
)
def test_what_can_not_run_is_a_load_time_error(params, expect):
    with pytest.raises(ConfigError, match=expect):
        Scheduler.from_config(load_config(f"plugins:\n- type: token-producer\n  parameters: {params}\n"))


def test_a_file_that_is_not_a_tokenizer_is_a_load_time_error(tmp_path):
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not a tokenizer")
    yaml = f"plugins:\n- type: token-producer\n  parameters: {{local: {{tokenizerPath: '{bad}'}}}}\n"
    with pytest.raises(ConfigError, match=r"not a tokenizer\.json"):
        Scheduler.from_config(load_config(yaml))


@pytest.mark.parametrize(
    "name",
    ["sim-epp-tokenizer-vllm-http-config.yaml", "sim-epp-kvcache-config.yaml", "epp-precise-prefix-cache-config.yaml"],
)
def test_llm_d_tokenizer_samples_route_to_the_pod_holding_the_blocks(name, tokenizer_json):
    load_config_file(FIXTURES / name)  # as written
    text = (FIXTURES / name).read_text()
    with TokenizeServer(tokenizer_json) as server:
        sched = Scheduler.from_config(load_config(text.replace("http://localhost:8000", server.url)))
        producer = next(p for p in sched.plugins.values() if isinstance(p, PrecisePrefixCacheProducer))
        bs = producer.precise.block_size
        eps = [endpoint(n, {"llm-d.ai/role": "decode"}) for n in ("decode-a", "decode-b")]
        for ep in eps:
            producer.set_kv_event_status(ep.name, LIVE)
        prompt = SHARED + " What is a fox?"
        ids = Tokenizer.from_file(str(tokenizer_json)).encode(prompt).ids
        n = len(ids) // bs
        stored = BlockStored(list(range(n)), None, ids[: n * bs], bs)
        producer.apply_kv_events("decode-b", [KVEventBatch(0.0, [stored])])
        for i in range(3):
            res = sched.schedule(request(prompt=prompt, request_id=f"s{i}"), eps)
            assert res.profile_results[res.primary_profile_name].target_endpoints[0].name == "decode-b"


def test_the_prefix_producers_read_the_tokens_through_its_key(tokenizer_json):
    """The precise producer consumes the token producer's key: the profile runs the token producer
    first. The burst producer reads it in its window, before the rounds: the token producer runs
    there (where the request arrives, off the event loop), not in the profile."""
    local = f'{{local: {{tokenizerPath: "{tokenizer_json}"}}}}'
    precise = Scheduler.from_config(load_config(f"""
plugins:
- {{type: precise-prefix-cache-producer}}
- {{type: token-producer, parameters: {local}}}
- {{type: prefix-cache-scorer, parameters: {{prefixMatchInfoProducerName: precise-prefix-cache-producer}}}}
"""))  # fmt: skip
    producers = precise.profiles["default"].producers
    assert [p.name for p in producers] == ["token-producer", "precise-prefix-cache-producer"]
    burst_yaml = f"""
plugins:
- {{type: burst-prefix-cache-producer, parameters: {{windowDurationMs: 1}}}}
- {{type: token-producer, parameters: {local}}}
- {{type: prefix-cache-scorer, parameters: {{prefixMatchInfoProducerName: burst-prefix-cache-producer}}}}
schedulingProfiles: [{{name: default, plugins: [{{pluginRef: prefix-cache-scorer}}]}}]
"""
    burst = Scheduler.from_config(load_config(burst_yaml))
    assert [p.name for p in burst.profiles["default"].producers] == ["burst-prefix-cache-producer"]
    assert [p.name for p in burst.preparation.producers] == ["token-producer"]
    assert build_plugins(load_config(burst_yaml)).placement["token-producer"] == {Placement.GATEWAY}
    req = request(prompt=SHARED, request_id="b1")
    asyncio.run(burst.aschedule(req, [endpoint("a"), endpoint("b")]))
    assert request_tokens(req) == Tokenizer.from_file(str(tokenizer_json)).encode(SHARED).ids
    assert burst.plugins["token-producer"].info()["misses"] >= 1  # tokenized once, at the preparation
