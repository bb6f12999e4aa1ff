"""vLLM's Responses API (`/v1/responses`) on a simulated pod, with the pod's own response store:
a follow-up naming a `previous_response_id` this pod did not make is a 404, as on a real server,
so a router that sends it elsewhere is caught. Streamed answers use the Responses event names.
A `background` response is answered at once (`queued`) and generated on; `POST
/v1/responses/{id}/cancel` stops it (`cancelled`), and cancelling one that is not running is a
400, as vLLM answers."""

from __future__ import annotations

import asyncio
import json
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ray_epp.simulator.engine_request import FINISHED, EngineRequest
from ray_epp.simulator.openai_api import error_body, validation_error
from ray_epp.simulator.text import fake_tokens
from ray_epp.simulator.tokens import count_tokens, parts_text

if TYPE_CHECKING:
    from ray_epp.simulator.http_server import SimPod

MAX_STORED = 10_000  # responses a pod keeps; the oldest go first


class ResponsesBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str = Field(min_length=1)
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    previous_response_id: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    stream: bool = False
    store: bool = True
    background: bool = False


def input_messages(body: ResponsesBody) -> list[dict[str, str]]:
    """The request's own turns as chat messages: a string is one user turn; items with a role
    are messages, other items (tool outputs) are given to the model as user text."""
    if isinstance(body.input, str):
        return [{"role": "user", "content": body.input}]
    out = []
    for item in body.input:
        role = item.get("role")
        text = parts_text(item.get("content")) if role else parts_text(item.get("output", json.dumps(item)))
        out.append({"role": str(role or "user"), "content": text})
    return out


def _event(kind: str, seq: int, **fields: Any) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': seq, **fields})}\n\n".encode()


class ResponsesApi:
    """The routes and the store of one pod."""

    def __init__(self, pod: SimPod) -> None:
        self.pod = pod
        self.store: OrderedDict[str, tuple[dict[str, Any], list[dict[str, str]]]] = OrderedDict()
        self.running: dict[str, tuple[EngineRequest, asyncio.Task[None]]] = {}  # background responses

    def install(self, router: web.UrlDispatcher) -> None:
        router.add_post("/v1/responses", self.create)
        router.add_get("/v1/responses/{response_id}", self.retrieve)
        router.add_delete("/v1/responses/{response_id}", self.delete)
        router.add_post("/v1/responses/{response_id}/cancel", self.cancel)

    def _missing(self, response_id: str, param: str | None = None) -> web.Response:
        body = error_body(404, f"Response with id '{response_id}' not found.", param)
        return web.json_response(body, status=404)

    async def retrieve(self, request: web.Request) -> web.Response:
        rid = request.match_info["response_id"]
        if rid not in self.store:
            return self._missing(rid)
        return web.json_response(self.store[rid][0])

    async def delete(self, request: web.Request) -> web.Response:
        rid = request.match_info["response_id"]
        if self.store.pop(rid, None) is None:
            return self._missing(rid)
        return web.json_response({"id": rid, "object": "response.deleted", "deleted": True})

    async def cancel(self, request: web.Request) -> web.Response:
        rid = request.match_info["response_id"]
        if rid not in self.store:
            return self._missing(rid)
        running = self.running.pop(rid, None)
        if running is None:
            body = error_body(400, "Cannot cancel a synchronous response.")
            return web.json_response(body, status=400)
        r, task = running
        task.cancel()
        self.pod.engine.abort(r)
        response = {**self.store[rid][0], "status": "cancelled"}
        self.store[rid] = (response, self.store[rid][1])
        return web.json_response(response)

    def _in_background(self, r: EngineRequest, body: ResponsesBody, turns: list[dict[str, str]], n: int) -> dict:
        """Store the response as `queued` and generate it on; the stored one becomes `completed`."""
        queued = self._response(r, body, "queued", None, n)
        self.store[r.request_id] = (queued, turns)

        async def generate() -> None:
            await r.sink.done
            self.running.pop(r.request_id, None)
            if r.state == FINISHED:
                self._finish(r, body, turns, n)

        self.running[r.request_id] = (r, asyncio.get_running_loop().create_task(generate()))
        return queued

    async def create(self, request: web.Request) -> web.StreamResponse:
        pod = self.pod
        try:
            body = ResponsesBody.model_validate(json.loads(await request.read()))
        except (ValueError, UnicodeDecodeError) as exc:
            message, param = validation_error(exc) if isinstance(exc, ValidationError) else (str(exc), None)
            return web.json_response(error_body(400, message, param), status=400)
        history: list[dict[str, str]] = []
        if body.previous_response_id is not None:
            if body.previous_response_id not in self.store:
                return self._missing(body.previous_response_id, "previous_response_id")
            history = self.store[body.previous_response_id][1]
        system = [{"role": "system", "content": body.instructions}] if body.instructions else []
        turns = history + input_messages(body)
        try:
            lora = pod.engine.resolve_model(body.model)
        except KeyError:
            return web.json_response(error_body(404, f"The model `{body.model}` does not exist.", "model"), status=404)
        prompt = pod.engine.engine_prompt(None, system + turns)
        max_tokens = body.max_output_tokens or pod.cfg.default_max_tokens
        problem = pod.engine.check(count_tokens(prompt), max_tokens)
        if problem:
            return web.json_response(error_body(400, *problem), status=400)
        if body.background and (body.stream or not body.store):
            message = "background can be used only with store=true and without stream"
            return web.json_response(error_body(400, message, "background"), status=400)
        n = next(pod._ids)
        r = pod.submit(f"resp_{pod.name}-{n}", prompt, max_tokens, body.stream, lora=lora)
        if body.background:
            return web.json_response(self._in_background(r, body, turns, n))
        try:
            if body.stream:
                return await self._stream(request, r, body, turns, n)
            await r.sink.done
            if r.state != FINISHED:
                return web.json_response(error_body(503, "The engine stopped before the request finished."), 503)
            return web.json_response(self._finish(r, body, turns, n))
        finally:
            if r.state != FINISHED:
                pod.engine.abort(r)

    def _response(self, r: EngineRequest, body: ResponsesBody, status: str, text: str | None, n: int) -> dict:
        output = [] if text is None else [self._message(r, text, "completed")]
        usage = {"input_tokens": r.prompt_tokens, "output_tokens": r.num_output,
                 "total_tokens": r.prompt_tokens + r.num_output,
                 "input_tokens_details": {"cached_tokens": max(0, r.num_cached_tokens)},
                 "output_tokens_details": {"reasoning_tokens": 0}}  # fmt: skip
        return {"id": r.request_id, "object": "response", "created_at": int(time.time()), "status": status,
                "model": body.model, "instructions": body.instructions, "output": output,
                "previous_response_id": body.previous_response_id, "parallel_tool_calls": True,
                "tool_choice": "auto", "tools": [], "temperature": 1.0, "top_p": 1.0, "metadata": {},
                "error": None, "incomplete_details": None, "store": body.store, "background": body.background,
                "usage": usage if status == "completed" else None}  # fmt: skip

    @staticmethod
    def _message(r: EngineRequest, text: str, status: str) -> dict[str, Any]:
        content = [{"type": "output_text", "text": text, "annotations": []}] if status == "completed" else []
        return {"type": "message", "id": f"msg_{r.request_id}", "status": status, "role": "assistant",
                "content": content}  # fmt: skip

    def _finish(self, r: EngineRequest, body: ResponsesBody, turns: list[dict[str, str]], n: int) -> dict:
        text = fake_tokens(n, 0, r.num_output)
        response = self._response(r, body, "completed", text, n)
        if body.store:
            self.store[r.request_id] = (response, [*turns, {"role": "assistant", "content": text}])
            while len(self.store) > MAX_STORED:
                self.store.popitem(last=False)
        return response

    async def _stream(
        self, request: web.Request, r: EngineRequest, body: ResponsesBody, turns: list[dict[str, str]], n: int
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        seq = iter(range(1 << 30))
        started = self._response(r, body, "in_progress", None, n)
        await resp.write(_event("response.created", next(seq), response=started))
        await resp.write(_event("response.in_progress", next(seq), response=started))
        item_id = f"msg_{r.request_id}"
        await resp.write(_event("response.output_item.added", next(seq), output_index=0,
                                item=self._message(r, "", "in_progress")))  # fmt: skip
        part = {"type": "output_text", "text": "", "annotations": []}
        where = {"item_id": item_id, "output_index": 0, "content_index": 0}
        await resp.write(_event("response.content_part.added", next(seq), part=part, **where))
        sent = 0
        while (upto := await r.sink.queue.get()) is not None:
            if upto > sent:
                delta, sent = fake_tokens(n, sent, upto), upto
                await resp.write(_event("response.output_text.delta", next(seq), delta=delta, logprobs=[], **where))
        if r.state != FINISHED:
            return resp
        done = self._finish(r, body, turns, n)
        text = done["output"][0]["content"][0]["text"]
        await resp.write(_event("response.output_text.done", next(seq), text=text, logprobs=[], **where))
        await resp.write(_event("response.content_part.done", next(seq), part={**part, "text": text}, **where))
        await resp.write(_event("response.output_item.done", next(seq), output_index=0, item=done["output"][0]))
        await resp.write(_event("response.completed", next(seq), response=done))
        await resp.write_eof()
        return resp
