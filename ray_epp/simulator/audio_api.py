"""vLLM's speech-to-text APIs (`/v1/audio/transcriptions`, `/v1/audio/translations`) on a simulated
pod: a multipart form (`file`, `model`, `language`, `response_format`, `stream`), run through the
engine as a request whose prompt stands for the audio's encoder frames, so the pod's queue and KV
metrics show the load. The text is a function of the audio's bytes alone (and the task), so a test
can tell which answer belongs to which file, whichever pod served it."""

from __future__ import annotations

import hashlib
import json
import time
from typing import TYPE_CHECKING, Any

from aiohttp import BodyPartReader, web

from ray_epp.simulator.engine_request import FINISHED
from ray_epp.simulator.openai_api import error_body
from ray_epp.simulator.text import fake_tokens

if TYPE_CHECKING:
    from ray_epp.simulator.http_server import SimPod

FORMATS = ("json", "text", "verbose_json")
BYTES_PER_WORD = 256  # how much audio one output word stands for
MAX_WORDS = 448  # Whisper's decoder limit
MAX_FRAMES = 1500  # Whisper's encoder frames for 30 s
BYTES_PER_SECOND = 32000  # 16 kHz, 16-bit mono


def transcript(audio: bytes, task: str) -> str:
    """The words a pod 'hears' in `audio`: the same bytes give the same text on every pod."""
    seed = int.from_bytes(hashlib.sha256(task.encode() + audio).digest()[:4], "big")
    return fake_tokens(seed, 0, min(MAX_WORDS, len(audio) // BYTES_PER_WORD + 1)).strip()


class _Refused(Exception):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.response = web.json_response(error_body(400, message, param), status=400)


async def _form(request: web.Request) -> dict[str, Any]:
    """The form's fields: text fields as strings, `file` as bytes."""
    if not request.content_type.startswith("multipart/form-data"):
        raise _Refused(f"expected a multipart/form-data body, got {request.content_type!r}")
    fields: dict[str, Any] = {}
    reader = await request.multipart()
    while (part := await reader.next()) is not None:
        if isinstance(part, BodyPartReader) and part.name:
            fields[part.name] = bytes(await part.read()) if part.filename is not None else await part.text()
    return fields


class AudioApi:
    """The routes of one pod."""

    def __init__(self, pod: SimPod) -> None:
        self.pod = pod

    def install(self, router: web.UrlDispatcher) -> None:
        router.add_post("/v1/audio/transcriptions", self.transcriptions)
        router.add_post("/v1/audio/translations", self.translations)

    async def transcriptions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "transcribe")

    async def translations(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "translate")

    async def _serve(self, request: web.Request, task: str) -> web.StreamResponse:
        pod = self.pod
        try:
            fields = await _form(request)
            audio = fields.get("file")
            if not isinstance(audio, bytes) or not audio:
                raise _Refused("'file' is required: the audio, as a file part of the form", "file")
            model = str(fields.get("model") or pod.cfg.model)
            fmt = str(fields.get("response_format") or "json")
            if fmt not in FORMATS:
                raise _Refused(f"response_format must be one of {', '.join(FORMATS)}, got {fmt!r}", "response_format")
            stream = str(fields.get("stream", "false")).lower() == "true"
            lora = pod.engine.resolve_model(model)
        except _Refused as refused:
            return refused.response
        except KeyError:
            return web.json_response(error_body(404, f"The model `{model}` does not exist.", "model"), status=404)
        text = transcript(audio, task)
        words = text.split()
        seed = int.from_bytes(hashlib.sha256(audio).digest()[:4], "big")
        frames = [(seed + i) % 50000 + 1 for i in range(min(MAX_FRAMES, len(audio) // 64 + 1))]
        n = next(pod._ids)
        r = pod.submit(f"trsc-{pod.name}-{n}", frames, len(words), stream, ignore_eos=True, lora=lora)
        try:
            if stream:
                return await self._stream(request, r, model, words)
            await r.sink.done
            if r.state != FINISHED:
                return web.json_response(error_body(503, "The engine stopped before the request finished."), 503)
            if fmt == "text":
                return web.Response(text=text, content_type="text/plain")
            answer: dict[str, Any] = {"text": text}
            if fmt == "verbose_json":
                language = "en" if task == "translate" else str(fields.get("language") or "en")
                answer |= {"task": task, "language": language, "duration": len(audio) / BYTES_PER_SECOND,
                           "segments": []}  # fmt: skip
            return web.json_response(answer)
        finally:
            if r.state != FINISHED:
                pod.engine.abort(r)

    async def _stream(self, request: web.Request, r: Any, model: str, words: list[str]) -> web.StreamResponse:
        """vLLM's streamed transcription: `transcription.chunk` deltas as the words come, then [DONE]."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        created, sent = int(time.time()), 0
        while (upto := await r.sink.queue.get()) is not None:
            if upto > sent:
                delta = "".join(" " + w for w in words[sent:upto])
                sent = upto
                chunk = {"id": r.request_id, "object": "transcription.chunk", "created": created, "model": model,
                         "choices": [{"delta": {"content": delta}, "finish_reason": None}]}  # fmt: skip
                await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        if r.state != FINISHED:
            return resp
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp
