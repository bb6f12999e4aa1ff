"""vLLM's OpenAI completions and chat completions (`/v1/completions`, `/v1/chat/completions`) on a
simulated pod: a body's prompts (a batch, `n` choices each) become engine requests, answered whole
or streamed as the engine loop emits their tokens, with vLLM's usage and P/D `kv_transfer_params`."""

from __future__ import annotations

import asyncio
import json
import time
from functools import partial
from typing import TYPE_CHECKING, Any

from aiohttp import web
from pydantic import ValidationError

from ray_epp.simulator.engine_request import FINISHED, EngineRequest
from ray_epp.simulator.openai_api import ChatBody, CompletionBody, completion_logprobs, validation_error
from ray_epp.simulator.openai_http import BadRequest, error_reply, json_reply, read_json_object
from ray_epp.simulator.progress_sink import ProgressSink
from ray_epp.simulator.text import fake_tokens
from ray_epp.simulator.tokens import Prompt, count_tokens

if TYPE_CHECKING:
    from ray_epp.simulator.http_server import SimPod


class CompletionsApi:
    """The completion routes of one pod."""

    def __init__(self, pod: SimPod) -> None:
        self.pod = pod

    def install(self, router: web.UrlDispatcher) -> None:
        router.add_post("/v1/completions", partial(self.generate, chat=False))
        router.add_post("/v1/chat/completions", partial(self.generate, chat=True))

    def _parse(
        self, data: dict[str, Any], chat: bool
    ) -> tuple[CompletionBody | ChatBody, list[Prompt], int, str | None]:
        """Validate a body: (body, its prompts, max_tokens, lora) or BadRequest with vLLM's status.
        A completions body may hold a batch of prompts (strings or token lists)."""
        try:
            body: CompletionBody | ChatBody = (ChatBody if chat else CompletionBody).model_validate(data)
        except ValidationError as exc:
            message, param = validation_error(exc)
            raise BadRequest(400, message, param) from exc
        if not body.model:
            raise BadRequest(400, "The 'model' field is required.", "model")
        try:
            lora = self.pod.engine.resolve_model(body.model)
        except KeyError:
            raise BadRequest(404, f"The model `{body.model}` does not exist.", "model") from None
        prompts: list[Prompt]
        try:
            if isinstance(body, ChatBody):
                prompts = [self.pod.engine.engine_prompt(None, body.messages)]
                max_tokens = body.max_completion_tokens or body.max_tokens or self.pod.cfg.default_max_tokens
            else:
                if body.best_of is not None and body.best_of > 1:  # vLLM V1's engine refuses it
                    raise BadRequest(400, "vLLM V1 does not yet support best_of.", "best_of")
                raw = body.prompt
                batch = raw if isinstance(raw, list) and raw and not isinstance(raw[0], int) else [raw]
                prompts = [self.pod.engine.engine_prompt(p) for p in batch]  # type: ignore[arg-type]
                max_tokens = body.max_tokens or self.pod.cfg.default_max_tokens
        except ValueError as exc:  # a tokenizer without a chat template
            raise BadRequest(400, str(exc), "messages") from None
        for prompt in prompts:
            problem = self.pod.engine.check(count_tokens(prompt), max_tokens)
            if problem:
                raise BadRequest(400, *problem)
        return body, prompts, max_tokens, lora

    async def generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        if self.pod._starting():
            return error_reply(503, "The server is starting up.")
        failure = self.pod._draw_failure()
        if failure in ("429", "500", "503"):
            status = int(failure)  # type: ignore[arg-type]
            return error_reply(status, f"Injected failure ({status}).")
        try:
            body, prompts, max_tokens, lora = self._parse(await read_json_object(request), chat)
        except BadRequest as exc:
            return error_reply(exc.status, exc.message, exc.param)
        if failure == "drop" and not body.stream:
            if request.transport is not None:
                request.transport.close()
            return web.Response(status=500)  # never reaches the client: the connection is gone
        kvp = body.kv_transfer_params or {}
        n = next(self.pod._ids)
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{self.pod.name}-{n}"
        eng = self.pod.engine
        queue: asyncio.Queue[Any] | None = asyncio.Queue() if body.stream else None
        choices = len(prompts) * body.n  # choice i*n+j: prompt i's j-th answer, vLLM's order
        rs = [
            self.pod.submit(
                rid if choices == 1 else f"{rid}-{index}", prompts[index // body.n], max_tokens, body.stream,
                sink=ProgressSink(body.stream, queue, index), lora=lora, ignore_eos=body.ignore_eos,
                remote_prefill=bool(kvp.get("do_remote_prefill")), remote_decode=bool(kvp.get("do_remote_decode")),
            )
            for index in range(choices)
        ]  # fmt: skip
        try:
            if body.stream:
                return await self._stream(request, rs, rid, body, chat, n, drop=failure == "drop")
            await asyncio.gather(*(r.sink.done for r in rs))
            if any(r.state != FINISHED for r in rs):
                return error_reply(503, "The engine stopped before the request finished.")
            return json_reply(200, self._full_response(rs, rid, body, chat, n))
        finally:
            for r in rs:
                if r.state != FINISHED:
                    eng.abort(r)  # the client went away (or the server stops): free its blocks

    def _usage(self, rs: list[EngineRequest], n: int) -> dict[str, Any]:
        """A batch's usage as vLLM counts it: each prompt once (the first of its `n` choices)."""
        prompt = sum(r.prompt_tokens for r in rs[::n])
        output = sum(r.num_output for r in rs)
        return {
            "prompt_tokens": prompt,
            "total_tokens": prompt + output,
            "completion_tokens": output,
            "prompt_tokens_details": {"cached_tokens": sum(max(0, r.num_cached_tokens) for r in rs[::n])},
        }

    def _kv_params(self, r: EngineRequest) -> dict[str, Any] | None:
        if not r.remote_decode:
            return None
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": r.kv_blocks_out or [],
            "remote_engine_id": self.pod.engine.engine_id,
            "remote_request_id": r.request_id,
            "remote_host": self.pod.host,
            "remote_port": self.pod.port,
            "tp_size": 1,
        }

    def _full_response(
        self, rs: list[EngineRequest], rid: str, body: CompletionBody | ChatBody, chat: bool, n: int
    ) -> dict[str, Any]:
        created = int(time.time())
        choices: list[dict[str, Any]] = []
        for index, r in enumerate(rs):
            text = fake_tokens(n + index, 0, r.num_output)
            if chat:
                choices.append({"index": index, "message": {"role": "assistant", "content": text, "tool_calls": []},
                                "logprobs": None, "finish_reason": r.finish_reason, "stop_reason": None})  # fmt: skip
            else:
                logprobs = completion_logprobs(text, body.logprobs)  # type: ignore[union-attr]
                choices.append({"index": index, "text": text, "logprobs": logprobs, "finish_reason": r.finish_reason,
                                "stop_reason": None, "prompt_logprobs": None})  # fmt: skip
        obj = "chat.completion" if chat else "text_completion"
        return {"id": rid, "object": obj, "created": created, "model": body.model, "choices": choices,
                "usage": self._usage(rs, body.n), "kv_transfer_params": self._kv_params(rs[0])}  # fmt: skip

    async def _stream(
        self,
        request: web.Request,
        rs: list[EngineRequest],
        rid: str,
        body: CompletionBody | ChatBody,
        chat: bool,
        n: int,
        drop: bool,
    ) -> web.StreamResponse:
        """Every choice's tokens as they come (a chunk names its choice's index), then the
        usage of them all (with `stream_options.include_usage`) and [DONE]."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        created = int(time.time())
        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(choices: list[dict[str, Any]], **extra: Any) -> bytes:
            payload = {"id": rid, "object": obj, "created": created, "model": body.model,
                       "choices": choices, **extra}  # fmt: skip
            return b"data: " + json.dumps(payload).encode() + b"\n\n"

        role_sent = [not chat] * len(rs)  # vLLM sends a chat role chunk with the first output, after prefill
        queue = rs[0].sink.queue
        sent = [0] * len(rs)
        offsets = [0] * len(rs)  # each choice's text so far: where its next logprobs' tokens start
        running = len(rs)
        drop_at = max(1, rs[0].output_len // 2)
        while running:
            index, upto = await queue.get()
            if upto is None:
                running -= 1
                continue
            if upto <= sent[index]:
                continue
            r = rs[index]
            text = fake_tokens(n + index, sent[index], upto)
            sent[index] = upto
            if not role_sent[index]:
                role_sent[index] = True
                await resp.write(chunk([{"index": index, "delta": {"role": "assistant", "content": ""},
                                         "logprobs": None, "finish_reason": None}]))  # fmt: skip
            last = r.state == FINISHED and upto >= r.num_output
            reason = r.finish_reason if last else None
            if chat:
                choice = {"index": index, "delta": {"content": text}, "logprobs": None, "finish_reason": reason}
            else:
                logprobs = completion_logprobs(text, body.logprobs, offsets[index])  # type: ignore[union-attr]
                offsets[index] += len(text)
                choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": reason,
                          "stop_reason": None}  # fmt: skip
            await resp.write(chunk([choice]))
            if drop and index == 0 and upto >= drop_at and not last:
                for other in rs:
                    self.pod.engine.abort(other)
                if request.transport is not None:
                    request.transport.close()
                return resp
        if any(r.state != FINISHED for r in rs):
            return resp
        extra: dict[str, Any] = {}
        if rs[0].remote_decode:
            extra["kv_transfer_params"] = self._kv_params(rs[0])
        if body.include_usage:
            extra["usage"] = self._usage(rs, body.n)
        if extra:
            await resp.write(chunk([], **extra))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp
