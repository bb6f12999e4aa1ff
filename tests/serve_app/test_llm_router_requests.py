"""What EPPRequestRouter sees of a request's body, by the handle method it calls (Ray Serve LLM's
`LLMServer` methods): chat and completions (and Responses / Anthropic bodies, for a deployment
that serves them) give the prefix plugins their conversation, seen as the gateway sees it; the
APIs that generate nothing are routed by load. The real router, deciding on its mirror, over the
replica stand-ins of bench/llm_router_decision.py (no ray[llm] needed); vLLM's request classes
stood in by pydantic models with their fields."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from pydantic import BaseModel
from ray.serve._private.common import RequestMetadata
from ray.serve.request_router import PendingRequest

from bench.llm_router_decision import replicas, router
from serve_app.gateway.parsing import parse_request
from serve_app.gateway.settings import GatewaySettings
from serve_app.llm_router.requests import METHOD_PATHS, request_of

SYSTEM = "a long shared system prompt for every API " * 30
CHAT = {"model": "m", "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "q"}]}


def pending(args: list[Any], method: str) -> PendingRequest:
    """A handle call as the router gets it (made on a loop: it holds a future)."""
    meta = RequestMetadata(request_id="r", internal_request_id="r", call_method=method)

    async def make() -> PendingRequest:
        return PendingRequest(args=args, kwargs={}, metadata=meta)

    return asyncio.run(make())


def body_of(args: list[Any], method: str) -> dict[str, Any]:
    """What the router's scheduler sees of a call's body (plugins that read the prompt)."""
    return request_of(pending(args, method), "m", ("prompt", "messages")).body


class EmbeddingChatRequest(BaseModel):  # vLLM's, with the fields that matter here
    model: str
    messages: list[dict[str, Any]]
    encoding_format: str = "float"


class TokenizeCompletionRequest(BaseModel):
    model: str
    prompt: str


class TranscriptionRequest(BaseModel):
    model: str
    prompt: str = ""  # Whisper's text prompt: not a prompt to route by
    language: str | None = None


def test_each_methods_body_is_seen_through_its_apis_view():
    seen = body_of([CHAT], "chat")
    assert seen["messages"] == CHAT["messages"]
    responses = body_of([{"model": "m", "instructions": SYSTEM, "input": "q"}], "responses")
    anthropic = body_of([{"model": "m", "system": SYSTEM, "messages": [{"role": "user", "content": "q"}]}],
                        "messages")  # fmt: skip
    assert responses["messages"] == anthropic["messages"] == CHAT["messages"]  # one conversation, one prefix
    for method, request in [
        ("embeddings", EmbeddingChatRequest(model="m", messages=CHAT["messages"])),
        ("tokenize", TokenizeCompletionRequest(model="m", prompt=SYSTEM)),
        ("transcriptions", TranscriptionRequest(model="m", prompt=SYSTEM, language="en")),
        ("embeddings", {"model": "m", "input": SYSTEM}),
        ("score", {"model": "m", "text_1": SYSTEM, "text_2": "x"}),
    ]:
        body = body_of([request], method)
        assert body.get("model") == "m" and not {"prompt", "messages", "input"} & set(body), (method, body)
    assert body_of([{"model": "m"}], "chat") == {"model": "m"}  # invalid: by load; the replica answers it
    assert body_of([CHAT], "__call__") is CHAT  # a method of one's own: as it is


def test_the_router_and_the_gateway_make_the_same_request_of_a_body():
    """One way to make the scheduler's request (api_views.scheduling_request): what the gateway and
    ext_proc parse from HTTP and what a Serve router reads from a handle call agree."""
    for method, body in [
        ("chat", CHAT | {"cache_salt": "s", "max_tokens": 3}),
        ("completions", {"model": "m", "prompt": SYSTEM}),
        ("responses", {"model": "m", "instructions": SYSTEM, "input": "q"}),
        ("messages", {"model": "m", "system": SYSTEM, "messages": [{"role": "user", "content": "q"}]}),
        ("embeddings", {"model": "m", "input": SYSTEM}),
    ]:
        gateway = parse_request(json.dumps(body).encode(), {}, METHOD_PATHS[method], GatewaySettings(), None)
        router = request_of(pending([body], method), "deployment")
        assert (router.body, router.target_model) == (gateway.llm_request.body, gateway.llm_request.target_model)


def test_the_router_draws_a_conversation_to_its_prefix_and_routes_the_rest_by_load():
    async def run() -> dict[str, float]:
        epp = router()
        epp._trace_decisions = 16
        reps = replicas(3)
        epp.update_replicas(reps)  # type: ignore[arg-type]
        prefix_scores: dict[str, float] = {}
        sends = [
            ("chat", CHAT),  # learned at its decision
            ("responses", {"model": "m", "instructions": SYSTEM, "input": "q"}),
            ("messages", {"model": "m", "system": SYSTEM, "messages": [{"role": "user", "content": "q"}]}),
            ("embeddings", EmbeddingChatRequest(model="m", messages=CHAT["messages"])),
            ("tokenize", TokenizeCompletionRequest(model="m", prompt=SYSTEM)),
        ]
        for i, (method, body) in enumerate(sends):
            meta = RequestMetadata(request_id=f"q{i}", internal_request_id=f"q{i}", call_method=method)
            pending = PendingRequest(args=[body], kwargs={}, metadata=meta)
            ranked = await epp.choose_replicas(reps, pending)  # type: ignore[arg-type]
            epp.on_request_routed(pending, ranked[0][0].replica_id, None)
            scorers = epp.decision_traces[f"q{i}"]["profiles"]["default"]["scorers"]
            prefix = next(s["scores"] for s in scorers if s["plugin"] == "prefix-cache-scorer")
            prefix_scores[method] = max(prefix.values())
        return prefix_scores

    scores = asyncio.run(run())
    assert scores["chat"] == 0 and scores["responses"] > 0.9 and scores["messages"] > 0.9
    assert scores["embeddings"] == scores["tokenize"] == 0
