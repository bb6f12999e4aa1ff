"""vLLM's Anthropic Messages API (`/v1/messages`, `/v1/messages/count_tokens`) on a simulated pod:
`system`, content blocks, tools (a `tool_choice` of `any` or a named tool answers with a
`tool_use` block), streamed with Anthropic's event names, and errors in Anthropic's shape."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ray_epp.simulator.engine_request import FINISHED, EngineRequest
from ray_epp.simulator.openai_api import validation_error
from ray_epp.simulator.text import fake_tokens
from ray_epp.simulator.tokens import Prompt, count_tokens, parts_text

if TYPE_CHECKING:
    from ray_epp.simulator.http_server import SimPod

ERROR_TYPES = {400: "invalid_request_error", 404: "not_found_error", 429: "rate_limit_error",
               500: "api_error", 503: "overloaded_error"}  # fmt: skip


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]


class Tool(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str = Field(min_length=1)
    input_schema: dict[str, Any] = Field(default_factory=dict)


class CountBody(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str = Field(min_length=1)
    messages: list[Message] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[Tool] = Field(default_factory=list)


class MessagesBody(CountBody):
    max_tokens: int = Field(ge=1)
    stream: bool = False
    tool_choice: dict[str, Any] | None = None


def anthropic_error(status: int, message: str) -> web.Response:
    body = {"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": message}}
    return web.json_response(body, status=status)


def _event(kind: str, **fields: Any) -> bytes:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields})}\n\n".encode()


class MessagesApi:
    """The routes of one pod."""

    def __init__(self, pod: SimPod) -> None:
        self.pod = pod

    def install(self, router: web.UrlDispatcher) -> None:
        router.add_post("/v1/messages", self.create)
        router.add_post("/v1/messages/count_tokens", self.count_tokens)

    async def _read(self, request: web.Request, model: type[CountBody]) -> tuple[Any, Prompt, str | None]:
        """(body, prompt, lora) or an Anthropic-shaped error response raised as `_Refused`."""
        try:
            body = model.model_validate(json.loads(await request.read()))
        except ValidationError as exc:
            raise _Refused(anthropic_error(400, validation_error(exc)[0])) from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise _Refused(anthropic_error(400, f"Invalid JSON body: {exc}")) from None
        try:
            lora = self.pod.engine.resolve_model(body.model)
        except KeyError:
            raise _Refused(anthropic_error(404, f"model: {body.model} does not exist")) from None
        chat = [{"role": "system", "content": parts_text(body.system)}] if body.system else []
        if body.tools:
            chat.insert(0, {"role": "system", "content": json.dumps([t.model_dump() for t in body.tools])})
        chat += [{"role": m.role, "content": parts_text(m.content)} for m in body.messages]
        return body, self.pod.engine.engine_prompt(None, chat), lora

    async def count_tokens(self, request: web.Request) -> web.Response:
        try:
            _body, prompt, _lora = await self._read(request, CountBody)
        except _Refused as refused:
            return refused.response
        return web.json_response({"input_tokens": count_tokens(prompt)})

    async def create(self, request: web.Request) -> web.StreamResponse:
        pod = self.pod
        try:
            body, prompt, lora = await self._read(request, MessagesBody)
        except _Refused as refused:
            return refused.response
        problem = pod.engine.check(count_tokens(prompt), body.max_tokens)
        if problem:
            return anthropic_error(400, problem[0])
        n = next(pod._ids)
        r = pod.submit(f"msg_{pod.name}-{n}", prompt, body.max_tokens, body.stream, lora=lora)
        try:
            if body.stream:
                return await self._stream(request, r, body, n)
            await r.sink.done
            if r.state != FINISHED:
                return anthropic_error(503, "The engine stopped before the request finished.")
            return web.json_response(self._message(r, body, self._blocks(r, body, n), r.num_output))
        finally:
            if r.state != FINISHED:
                pod.engine.abort(r)

    @staticmethod
    def _tool(body: MessagesBody) -> Tool | None:
        """The tool a `tool_choice` of `any` or `tool` makes the model call."""
        choice = body.tool_choice or {}
        if not body.tools or choice.get("type") not in ("any", "tool"):
            return None
        return next((t for t in body.tools if t.name == choice.get("name")), body.tools[0])

    def _blocks(self, r: EngineRequest, body: MessagesBody, n: int) -> list[dict[str, Any]]:
        tool = self._tool(body)
        if tool is not None:
            return [{"type": "tool_use", "id": f"toolu_{r.request_id}", "name": tool.name, "input": {}}]
        return [{"type": "text", "text": fake_tokens(n, 0, r.num_output)}]

    def _message(self, r: EngineRequest, body: MessagesBody, content: list, output: int) -> dict[str, Any]:
        done = r.state == FINISHED
        reason = "tool_use" if self._tool(body) else "max_tokens" if r.finish_reason == "length" else "end_turn"
        return {"id": r.request_id, "type": "message", "role": "assistant", "model": body.model, "content": content,
                "stop_reason": reason if done else None, "stop_sequence": None,
                "usage": {"input_tokens": r.prompt_tokens, "output_tokens": output,
                          "cache_read_input_tokens": max(0, r.num_cached_tokens)}}  # fmt: skip

    async def _stream(self, request: web.Request, r: EngineRequest, body: MessagesBody, n: int) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        await resp.write(_event("message_start", message=self._message(r, body, [], 0)))
        tool = self._tool(body)
        start = {"type": "text", "text": ""} if tool is None else {**self._blocks(r, body, n)[0], "input": {}}
        await resp.write(_event("content_block_start", index=0, content_block=start))
        await resp.write(_event("ping"))
        sent = 0
        while (upto := await r.sink.queue.get()) is not None:
            if upto > sent and tool is None:
                delta = {"type": "text_delta", "text": fake_tokens(n, sent, upto)}
                await resp.write(_event("content_block_delta", index=0, delta=delta))
            sent = max(sent, upto)
        if r.state != FINISHED:
            return resp
        if tool is not None:
            delta = {"type": "input_json_delta", "partial_json": "{}"}
            await resp.write(_event("content_block_delta", index=0, delta=delta))
        await resp.write(_event("content_block_stop", index=0))
        final = self._message(r, body, [], r.num_output)
        await resp.write(_event("message_delta", delta={"stop_reason": final["stop_reason"], "stop_sequence": None},
                                usage=final["usage"]))  # cumulative, the input's cache reads included  # fmt: skip
        await resp.write(_event("message_stop"))
        await resp.write_eof()
        return resp


class _Refused(Exception):
    def __init__(self, response: web.Response) -> None:
        super().__init__(response.text)
        self.response = response
