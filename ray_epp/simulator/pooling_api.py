"""vLLM's non-generating APIs on a simulated pod: embeddings, pooling, classification, score and
rerank, and `/detokenize` (`/tokenize` is pod_kv.py's). Each input runs through the engine as a
one-token request, so the pod's queue and KV metrics show the load a router balances; the
answers are deterministic (a vector is a function of the text), so tests can compare them."""

from __future__ import annotations

import base64
import hashlib
import json
import math
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from ray_epp.simulator.engine_request import FINISHED
from ray_epp.simulator.openai_api import error_body, validation_error
from ray_epp.simulator.tokens import CHARS_PER_TOKEN, count_tokens, flatten_messages

if TYPE_CHECKING:
    from ray_epp.simulator.http_server import SimPod

EMBEDDING_DIM = 32
CLASSES = ("negative", "positive")
Text = str | list[int]


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    _lora: str | None = PrivateAttr(None)  # the adapter `model` names, when it names one

    @property
    def lora(self) -> str | None:
        return self._lora


class EmbeddingsBody(_Body):
    input: str | list[str] | list[int] | list[list[int]] | None = None
    messages: list[dict[str, Any]] | None = None
    encoding_format: str = Field("float", pattern="^(float|base64)$")
    dimensions: int | None = Field(None, ge=1, le=4096)


class ScoreBody(_Body):
    text_1: str | list[str]
    text_2: str | list[str]


class RerankBody(_Body):
    query: str
    documents: list[str] = Field(min_length=1)
    top_n: int | None = Field(None, ge=1)


class DetokenizeBody(_Body):
    tokens: list[int]


def vector(text: Text, dim: int = EMBEDDING_DIM) -> list[float]:
    """A unit vector that is a function of the text alone."""
    seed = hashlib.sha256(json.dumps(text).encode()).digest()
    raw = [b - 127.5 for b in (seed * (dim // len(seed) + 1))[:dim]]
    norm = math.sqrt(sum(x * x for x in raw)) or 1.0
    return [x / norm for x in raw]


def similarity(a: str, b: str) -> float:
    return sum(x * y for x, y in zip(vector(a), vector(b), strict=True)) / 2 + 0.5


def _texts(value: Any) -> list[Text]:
    """A string, a token list, or a list of either, as a list of inputs."""
    if isinstance(value, str) or (isinstance(value, list) and value and isinstance(value[0], int)):
        return [value]
    return list(value or [])


def detokenize(tokens: list[int]) -> str:
    """The text behind the simulator's tokens (4 characters a token, token_ids' inverse)."""
    return "".join(t.to_bytes(CHARS_PER_TOKEN, "big").lstrip(b"\0").decode(errors="replace") for t in tokens)


class PoolingApi:
    """The routes of one pod."""

    def __init__(self, pod: SimPod) -> None:
        self.pod = pod

    def install(self, router: web.UrlDispatcher) -> None:
        router.add_post("/v1/embeddings", self.embeddings)
        router.add_post("/pooling", self.pooling)
        router.add_post("/classify", self.classify)
        for path in ("/score", "/v1/score"):
            router.add_post(path, self.score)
        for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
            router.add_post(path, self.rerank)
        router.add_post("/detokenize", self.detokenize)

    async def _read(self, request: web.Request, model: type[_Body]) -> Any:
        try:
            body = model.model_validate(json.loads(await request.read()))
        except ValidationError as exc:
            raise _Refused(400, *validation_error(exc)) from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise _Refused(400, f"Invalid JSON body: {exc}") from None
        try:
            body._lora = self.pod.engine.resolve_model(body.model) if body.model else None
        except KeyError:
            raise _Refused(404, f"The model `{body.model}` does not exist.", "model") from None
        return body

    async def _run(self, texts: list[Text], lora: str | None) -> int:
        """Run each input as a one-token request (the pod's load); the prompt tokens."""
        pod, total = self.pod, 0
        for text in texts:
            tokens = count_tokens(text)
            problem = pod.engine.check(tokens, 1)
            if problem:
                raise _Refused(400, *problem)
            r = pod.submit(f"pool-{pod.name}-{next(pod._ids)}", text, 1, False, lora=lora)
            try:
                await r.sink.done
            finally:
                if r.state != FINISHED:
                    pod.engine.abort(r)
            total += tokens
        return total

    async def _answer(self, request: web.Request, model: type[_Body], build: Any) -> web.Response:
        try:
            body = await self._read(request, model)
            return web.json_response(await build(body))
        except _Refused as exc:
            return web.json_response(error_body(exc.status, exc.message, exc.param), status=exc.status)

    def _inputs(self, body: EmbeddingsBody) -> list[Text]:
        if body.messages is not None:
            return [flatten_messages(body.messages)]
        if body.input is None:
            raise _Refused(400, "Either input or messages is required.", "input")
        texts = _texts(body.input)
        if not texts:
            raise _Refused(400, "input must not be empty.", "input")
        return texts

    async def _pooled(
        self, request: web.Request, item: Callable[[EmbeddingsBody, Text], dict[str, Any]]
    ) -> web.Response:
        """An answer of one item per input (`item`: its fields), after the inputs ran."""

        async def build(body: EmbeddingsBody) -> dict[str, Any]:
            texts = self._inputs(body)
            used = await self._run(texts, body.lora)
            data = [{"index": i, **item(body, text)} for i, text in enumerate(texts)]
            return {"object": "list", "id": f"pool-{self.pod.name}", "model": body.model, "data": data,
                    "usage": {"prompt_tokens": used, "total_tokens": used}}  # fmt: skip

        return await self._answer(request, EmbeddingsBody, build)

    async def embeddings(self, request: web.Request) -> web.Response:
        def item(body: EmbeddingsBody, text: Text) -> dict[str, Any]:
            vec = vector(text, body.dimensions or EMBEDDING_DIM)
            if body.encoding_format == "base64":
                return {
                    "object": "embedding",
                    "embedding": base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode(),
                }
            return {"object": "embedding", "embedding": vec}

        return await self._pooled(request, item)

    async def pooling(self, request: web.Request) -> web.Response:
        return await self._pooled(request, lambda _body, text: {"object": "pooling", "data": vector(text)})

    async def classify(self, request: web.Request) -> web.Response:
        def item(_body: EmbeddingsBody, text: Text) -> dict[str, Any]:
            p = similarity(json.dumps(text), "positive")
            return {"label": CLASSES[p >= 0.5], "probs": [1 - p, p], "num_classes": 2}

        return await self._pooled(request, item)

    async def score(self, request: web.Request) -> web.Response:
        async def build(body: ScoreBody) -> dict[str, Any]:
            lefts, rights = _texts(body.text_1), _texts(body.text_2)
            if len(lefts) == 1:
                lefts = lefts * len(rights)
            if len(lefts) != len(rights):
                raise _Refused(400, "text_1 and text_2 must have the same length, or text_1 one item.", "text_2")
            used = await self._run([f"{a}{b}" for a, b in zip(lefts, rights, strict=True)], body.lora)
            data = [{"index": i, "object": "score", "score": similarity(str(a), str(b))}
                    for i, (a, b) in enumerate(zip(lefts, rights, strict=True))]  # fmt: skip
            return {"object": "list", "model": body.model, "data": data,
                    "usage": {"prompt_tokens": used, "total_tokens": used}}  # fmt: skip

        return await self._answer(request, ScoreBody, build)

    async def rerank(self, request: web.Request) -> web.Response:
        async def build(body: RerankBody) -> dict[str, Any]:
            used = await self._run([body.query + d for d in body.documents], body.lora)
            ranked = sorted(
                ({"index": i, "document": {"text": d}, "relevance_score": similarity(body.query, d)}
                 for i, d in enumerate(body.documents)),
                key=lambda r: -r["relevance_score"],
            )  # fmt: skip
            return {"id": f"rerank-{self.pod.name}", "model": body.model, "results": ranked[: body.top_n],
                    "usage": {"total_tokens": used}}  # fmt: skip

        return await self._answer(request, RerankBody, build)

    async def detokenize(self, request: web.Request) -> web.Response:
        async def build(body: DetokenizeBody) -> dict[str, Any]:
            return {"prompt": detokenize(body.tokens)}

        return await self._answer(request, DetokenizeBody, build)


class _Refused(Exception):
    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
