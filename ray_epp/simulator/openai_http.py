"""The OpenAI-shaped HTTP answers every route of a simulated pod shares (aiohttp), and reading a
request's JSON object body into them: one place for vLLM's error shape."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from ray_epp.simulator.openai_api import error_body


def json_reply(status: int, body: dict[str, Any]) -> web.Response:
    return web.Response(status=status, text=json.dumps(body), content_type="application/json")


def error_reply(status: int, message: str, param: str | None = None) -> web.Response:
    return json_reply(status, error_body(status, message, param))


class BadRequest(Exception):
    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param


async def read_json_object(request: web.Request) -> dict[str, Any]:
    """The body as a JSON object, or `BadRequest` (400) saying what is wrong with it."""
    try:
        data = json.loads(await request.read())
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(400, f"Invalid JSON body: {exc}") from exc
    if not isinstance(data, dict):
        raise BadRequest(400, "The request body must be a JSON object.")
    return data
