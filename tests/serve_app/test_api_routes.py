"""The vLLM APIs beyond completions and chat, through a real deployment (real Ray, Serve gateway,
simulated vLLM pods on 127.0.0.1) with the official SDKs: the Responses API's conversations stay
on the pod that stores them, streamed and not; its errors. On test_gateway_e2e.py's deployment
(BOTH_DOORS); the test that removes a pod runs after the other modules' tests on it, before
those that stop every pod."""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest

from tests.serve_app.deployments import BOTH_DOORS, wait_until

pytestmark = pytest.mark.ray

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
E2E_SETUP = BOTH_DOORS
DEBUG = {"x-epp-debug": BOTH_DOORS.spec["settings"]["debug_token"]}
AUTH = {"Authorization": f"Bearer {BOTH_DOORS.spec['settings']['admin_token']}"}


@pytest.fixture(scope="module")
def oai(gateway):
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0)


def pod_of(response_id: str) -> str:
    """The simulator names its responses `resp_<pod>-<n>`."""
    return response_id.removeprefix("resp_").rsplit("-", 1)[0]


def error_of(err: openai.APIStatusError) -> dict:
    return err.response.json()["error"]


def test_a_conversation_stays_on_the_pod_that_stores_it(oai, sim):
    raw = oai.responses.with_raw_response.create(model=MODEL, input="first turn " * 20, instructions="be brief",
                                                 max_output_tokens=4)  # fmt: skip
    first = raw.parse()
    pod = pod_of(first.id)
    port = next(p.port for p in sim.pods if p.name == pod)
    assert raw.headers["x-gateway-destination-endpoint"].endswith(f":{port}")
    turn = first
    for i in range(4):  # a pod that did not make the previous response would answer 404
        turn = oai.responses.create(model=MODEL, input=[{"role": "user", "content": f"turn {i}"}],
                                    previous_response_id=turn.id, max_output_tokens=3)  # fmt: skip
        assert pod_of(turn.id) == pod and turn.previous_response_id is not None
    assert oai.responses.retrieve(turn.id).id == turn.id


def test_a_streamed_conversation_stays_on_its_pod(oai):
    previous, pods = None, set()
    for i in range(3):
        stream = oai.responses.create(model=MODEL, input=f"streamed turn {i} " * 10, max_output_tokens=4,
                                      previous_response_id=previous, stream=True)  # fmt: skip
        events = list(stream)
        assert events[0].type == "response.created" and events[-1].type == "response.completed"
        previous = events[-1].response.id
        pods.add(pod_of(previous))
    assert len(pods) == 1


def test_delete_goes_to_the_pod_and_drops_the_pin(oai):
    made = oai.responses.create(model=MODEL, input="to be deleted", max_output_tokens=2)
    oai.responses.delete(made.id)
    with pytest.raises(openai.NotFoundError) as err:
        oai.responses.retrieve(made.id)
    assert error_of(err.value)["code"] == "response_not_found"


def test_unknown_previous_response_is_the_gateways_404(oai):
    with pytest.raises(openai.NotFoundError) as err:
        oai.responses.create(model=MODEL, input="x", previous_response_id="resp_never-made")
    body = error_of(err.value)
    assert body["code"] == "response_not_found" and body["param"] == "previous_response_id"
    assert "resp_never-made" in body["message"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": MODEL}, "input"),
        ({"model": MODEL, "input": 7}, "input"),
        ({"model": MODEL, "input": "x", "previous_response_id": ""}, "previous_response_id"),
        ({"model": MODEL, "input": "x", "instructions": ["no"]}, "instructions"),
        ({"input": "x"}, "model"),
    ],
)
def test_malformed_responses_bodies_are_400s_naming_the_parameter(client, body, param):
    resp = client.post("/v1/responses", json=body)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param


LOAD_BODIES = {
    "/v1/embeddings": {"input": ["a", "b"]},
    "/pooling": {"input": "a"},
    "/classify": {"input": "a"},
    "/score": {"text_1": "q", "text_2": ["a"]},
    "/v1/score": {"text_1": "q", "text_2": "a"},
    "/rerank": {"query": "q", "documents": ["a", "b"]},
    "/v1/rerank": {"query": "q", "documents": ["a"]},
    "/v2/rerank": {"query": "q", "documents": ["a"]},
    "/tokenize": {"prompt": "hello world!"},
    "/detokenize": {"tokens": [1751477356]},
}


def test_embeddings_through_the_gateway_with_the_sdk(oai):
    from ray_epp.simulator.pooling_api import vector

    out = oai.embeddings.create(model=MODEL, input=["alpha", "beta"])
    assert [d.embedding for d in out.data] == [pytest.approx(vector("alpha")), pytest.approx(vector("beta"))]


def test_every_load_routed_api_is_served(client):
    from serve_app.gateway.api_views import FORM_PATHS, LOAD_VIEWS

    assert set(LOAD_BODIES) | FORM_PATHS == set(LOAD_VIEWS)  # the forms: test_speech_to_text_*
    for path, body in LOAD_BODIES.items():
        resp = client.post(path, json={"model": MODEL, **body})
        assert resp.status_code == 200, (path, resp.text)
        assert "x-gateway-destination-endpoint" in resp.headers


def prefix_scores(resp: httpx.Response) -> dict[str, float]:
    scorers = json.loads(resp.headers["x-epp-trace"])["trace"]["profiles"]["default"]["scorers"]
    return next(s["scores"] for s in scorers if s["type"] == "prefix-cache-scorer")


def test_load_routed_apis_have_no_prefix_affinity(client):
    """A chat prompt's prefix draws its repeat to its pod; the same text as an embeddings input
    is seen by no prefix plugin."""
    text = "a long shared document " * 60
    chat = {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 1}
    client.post("/v1/chat/completions", json=chat)

    def favoured() -> httpx.Response | None:
        resp = client.post("/v1/chat/completions", json=chat, headers=DEBUG)
        return resp if max(prefix_scores(resp).values()) > 0 else None

    wait_until(favoured)  # the chat repeat scores its prefix
    embed = client.post("/v1/embeddings", json={"model": MODEL, "input": text}, headers=DEBUG)
    assert embed.status_code == 200 and set(prefix_scores(embed).values()) == {0.0}


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/embeddings", {"model": MODEL}, "input"),
        ("/score", {"model": MODEL, "text_1": "q"}, "text_2"),
        ("/v1/rerank", {"model": MODEL, "query": "q"}, "documents"),
        ("/tokenize", {"model": MODEL}, "prompt"),
        ("/detokenize", {"model": MODEL}, "tokens"),
        ("/v1/embeddings", {"input": "x"}, "model"),
    ],
)
def test_malformed_load_routed_bodies_are_400s(client, path, body, param):
    resp = client.post(path, json=body)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == param


def test_a_pods_own_error_comes_back_unchanged(client):
    resp = client.post("/v1/rerank", json={"model": MODEL, "query": "q", "documents": []})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "documents"


WEATHER = {"name": "get_weather", "description": "weather", "input_schema": {"type": "object", "properties": {}}}


@pytest.fixture(scope="module")
def claude(gateway):
    return anthropic.Anthropic(base_url=gateway.url, api_key="unused", max_retries=0)


def test_anthropic_messages_streamed_and_with_tools(claude):
    with claude.messages.stream(model=MODEL, max_tokens=4, system="be brief",
                                messages=[{"role": "user", "content": "hi"}]) as stream:  # fmt: skip
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert len(text.split()) == 4 and final.content[0].text == text
    call = claude.messages.create(model=MODEL, max_tokens=4, tools=[WEATHER], tool_choice={"type": "any"},
                                  messages=[{"role": "user", "content": "weather?"}])  # fmt: skip
    assert call.stop_reason == "tool_use" and call.content[0].name == "get_weather"
    turns = [{"role": "user", "content": "weather?"}, {"role": "assistant", "content": call.content},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.content[0].id,
                                           "content": "sunny"}]}]  # fmt: skip
    assert claude.messages.create(model=MODEL, max_tokens=2, tools=[WEATHER], messages=turns).content[0].text
    assert claude.messages.count_tokens(model=MODEL, messages=turns, tools=[WEATHER]).input_tokens > 0


def test_anthropic_messages_share_the_chat_prefix_view(client):
    """A repeated system prompt draws the next request to the pod that has its prefix."""
    body = {"model": MODEL, "max_tokens": 1, "system": "a long shared system prompt " * 60,
            "messages": [{"role": "user", "content": "q"}]}  # fmt: skip

    def favoured() -> httpx.Response | None:
        resp = client.post("/v1/messages", json=body, headers=DEBUG)
        return resp if max(prefix_scores(resp).values()) > 0 else None

    wait_until(favoured)


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/v1/messages", {"model": MODEL, "max_tokens": 5, "messages": []}, 400),
        ("/v1/messages", {"model": MODEL, "max_tokens": 5, "messages": "hi"}, 400),
        ("/v1/messages", {"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}, 400),
        ("/v1/messages/count_tokens", {"model": MODEL}, 400),
        ("/v1/messages", {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}, 400),  # the pod's
    ],
)
def test_anthropic_route_errors_are_in_anthropics_shape(client, path, body, status):
    resp = client.post(path, json=body)
    assert resp.status_code == status, resp.text
    answer = resp.json()
    assert answer["type"] == "error" and answer["error"]["type"] == "invalid_request_error"
    assert answer["error"]["message"]


def test_the_anthropic_sdk_reads_the_gateways_error(claude):
    with pytest.raises(anthropic.BadRequestError, match="messages"):
        claude.messages.create(model=MODEL, max_tokens=4, messages=[])


def test_batch_completions_through_the_gateway(oai):
    out = oai.completions.create(model=MODEL, prompt=["abcd" * 5, "efgh" * 10], max_tokens=3, n=2)
    assert [ch.index for ch in out.choices] == [0, 1, 2, 3] and out.usage.prompt_tokens == 15
    stream = oai.completions.create(model=MODEL, prompt=[[1, 2, 3], [4, 5]], max_tokens=2, stream=True,
                                    stream_options={"include_usage": True})  # fmt: skip
    chunks = list(stream)
    assert {ch.index for c in chunks for ch in c.choices} == {0, 1}
    assert chunks[-1].usage.completion_tokens == 4


@pytest.mark.parametrize("prompt", [[], 7, [1.5], [["a"]], {"text": "x"}])
def test_malformed_completion_prompts_are_the_gateways_400(client, prompt):
    resp = client.post("/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 1})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == "prompt" and "x-gateway-destination-endpoint" not in resp.headers


def test_a_background_response_is_cancelled_at_the_pod_that_runs_it(oai, sim):
    running = oai.responses.create(model=MODEL, input="a long background task", max_output_tokens=3000,
                                   background=True)  # fmt: skip
    assert running.status == "queued"
    raw = oai.responses.with_raw_response.cancel(running.id)  # any other pod would answer 404
    port = next(p.port for p in sim.pods if p.name == pod_of(running.id))
    assert raw.headers["x-gateway-destination-endpoint"].endswith(f":{port}")
    assert raw.parse().status == "cancelled" and oai.responses.retrieve(running.id).status == "cancelled"
    with pytest.raises(openai.BadRequestError, match="synchronous"):  # the pod's own answer, unchanged
        oai.responses.cancel(oai.responses.create(model=MODEL, input="done", max_output_tokens=1).id)
    with pytest.raises(openai.NotFoundError) as err:
        oai.responses.cancel("resp_never-made")
    assert error_of(err.value)["code"] == "response_not_found" and error_of(err.value)["param"] == "response_id"


AUDIO = bytes(range(256)) * 16


def test_speech_to_text_forms_are_forwarded_whole(oai, client):
    from ray_epp.simulator.audio_api import transcript

    raw = oai.audio.transcriptions.with_raw_response.create(model=MODEL, file=("clip.wav", AUDIO), language="en")
    assert raw.parse().text == transcript(AUDIO, "transcribe") and raw.headers["x-gateway-destination-endpoint"]
    assert oai.audio.translations.create(model=MODEL, file=("clip.wav", AUDIO)).text == transcript(AUDIO, "translate")
    form = {"data": {"model": MODEL, "stream": "true"}, "files": {"file": ("c.wav", AUDIO)}}
    with client.stream("POST", "/v1/audio/transcriptions", **form) as streamed:  # vLLM's transcription.chunk events
        events = [json.loads(line[6:]) for line in streamed.iter_lines() if line.startswith("data: {")]
    assert streamed.headers["content-type"].startswith("text/event-stream") and len(events) > 1
    assert "".join(e["choices"][0]["delta"]["content"] for e in events).strip() == transcript(AUDIO, "transcribe")
    as_text = client.post("/v1/audio/transcriptions", data={"model": MODEL, "response_format": "text"},
                          files={"file": ("c.wav", AUDIO)}, headers=DEBUG)  # fmt: skip
    assert as_text.status_code == 200 and as_text.text.strip() == transcript(AUDIO, "transcribe")
    assert set(prefix_scores(as_text).values()) == {0.0}  # routed by load: no prompt for a prefix plugin


@pytest.mark.parametrize(
    ("send", "param", "says"),
    [
        ({"json": {"model": MODEL, "file": "x"}}, None, "multipart/form-data"),
        ({"files": {"model": (None, MODEL)}}, "file", "'file' is required"),
        ({"files": {"file": ("c.wav", AUDIO)}}, "model", "'model'"),
        ({"data": {"model": MODEL, "stream": "maybe"}, "files": {"file": ("c.wav", AUDIO)}}, "stream", "boolean"),
        ({"content": b"--x\r\nno end", "headers": {"content-type": "multipart/form-data; boundary=x"}}, None,
         "ends inside a part"),
    ],
)  # fmt: skip
def test_malformed_speech_to_text_forms_are_the_gateways_400(client, send, param, says):
    resp = client.post("/v1/audio/transcriptions", **send)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["param"] == param and says in error["message"] and "x-gateway-destination-endpoint" not in resp.headers


def output_tokens(client) -> float:
    """The gateway's count of output tokens read from answers' usage (the ResponseUsage path)."""
    from prometheus_client.parser import text_string_to_metric_families

    families = text_string_to_metric_families(client.get("/metrics").text)
    return sum(s.value for f in families for s in f.samples if s.name == "llm_d_epp_request_output_tokens_sum")


def counts_tokens(client, send) -> None:
    """`send()` returns the output tokens its answer carried; the gateway's count grows by them."""
    before = output_tokens(client)
    sent = send()
    assert sent > 0
    wait_until(lambda: output_tokens(client) - before == sent, timeout_s=5)


def test_an_anthropic_streams_usage_is_read(claude, client):
    def send() -> int:
        with claude.messages.stream(model=MODEL, max_tokens=7, messages=[{"role": "user", "content": "hi"}]) as s:
            final = s.get_final_message()
        assert final.usage.input_tokens > 0
        return final.usage.output_tokens

    counts_tokens(client, send)


def test_completions_logprobs_best_of_and_streamed_usage_pass_and_are_counted(oai, client):
    out = oai.completions.create(model=MODEL, prompt="hello", max_tokens=3, logprobs=2, best_of=1)
    assert len(out.choices[0].logprobs.tokens) == 3 and len(out.choices[0].logprobs.top_logprobs[0]) == 2
    with pytest.raises(openai.BadRequestError, match="best_of") as err:  # vLLM V1's refusal comes back as is
        oai.completions.create(model=MODEL, prompt="hello", max_tokens=3, best_of=3)
    assert error_of(err.value)["param"] == "best_of"

    def streamed() -> int:
        chunks = list(oai.completions.create(model=MODEL, prompt="hello", max_tokens=5, logprobs=1, stream=True,
                                             stream_options={"include_usage": True}))  # fmt: skip
        assert all(c.choices[0].logprobs.tokens for c in chunks if c.choices)
        return chunks[-1].usage.completion_tokens

    counts_tokens(client, streamed)


@pytest.mark.spends_e2e_setup
def test_removing_the_pinned_pod_is_a_503_while_it_drains_then_a_410(oai, client):
    """Runs after the deployment's other tests: it takes a pod out of the pool. A stream still
    running on the pod keeps it draining (in the pool, taking no new request); once it has left,
    its responses are gone."""
    made = oai.responses.create(model=MODEL, input="before the pod leaves", max_output_tokens=2)
    pod = pod_of(made.id)
    follow_up = {"model": MODEL, "input": "x", "previous_response_id": made.id}
    long_turn = {**follow_up, "stream": True, "max_output_tokens": 300}
    with client.stream("POST", "/v1/responses", json=long_turn) as stream:
        lines = stream.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))  # running on the pinned pod
        assert client.delete(f"/admin/pods/{pod}", headers=AUTH).status_code == 200

        def refused() -> httpx.Response | None:
            resp = client.post("/v1/responses", json=follow_up)
            return resp if resp.status_code == 503 else None

        draining = wait_until(refused, timeout_s=10)
        error = draining.json()["error"]
        assert error["code"] == "response_pod_unavailable" and "draining" in error["message"]
        assert draining.headers["retry-after"] and error["param"] == "previous_response_id"
        assert "response.completed" in "".join(lines)  # the stream in flight finishes on its pod

    def gone() -> httpx.Response | None:
        resp = client.post("/v1/responses", json=follow_up)
        return resp if resp.status_code == 410 else None

    error = wait_until(gone, timeout_s=20).json()["error"]
    assert error["code"] == "response_pod_gone" and pod in error["message"]
    assert client.get(f"/v1/responses/{made.id}").status_code == 410
    # a new conversation is scheduled over the pods that are left
    assert pod_of(oai.responses.create(model=MODEL, input="after", max_output_tokens=2).id) != pod
