"""A simulated pod's KV-event publisher and its `/tokenize` and `/reset_prefix_cache` routes.

The pod publishes its engine's cache events as a vLLM engine run with
`--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq", ...}'` does: a PUB socket
(`cfg.kv_events_port`, 0 for a free one) and a replay ROUTER (a free port) on the pod's host,
named in the pod's entry of the pods list as `kvEvents: {endpoint, replay}`. The first batch is an
`AllBlocksCleared`, so a subscriber that followed an earlier process on the same port starts
from an empty picture.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from ray_epp.kvevents import AllBlocksCleared, KVEventBatch, ZmqEventPublisher
from ray_epp.simulator.engine import Engine
from ray_epp.simulator.tokens import token_ids


class PodKVEvents:
    """The engine's KV events on ZMQ; `publish_pending()` after each engine step."""

    def __init__(self, engine: Engine, host: str) -> None:
        self.engine = engine
        engine.enable_kv_events()
        port = engine.cfg.kv_events_port
        self.publisher = ZmqEventPublisher(f"tcp://{host}:{port}", f"tcp://{host}:0")
        self.publisher.publish(KVEventBatch(ts=time.time(), events=[AllBlocksCleared()]))

    def info(self) -> dict[str, str]:
        return {"endpoint": self.publisher.endpoint, "replay": self.publisher.replay_endpoint or ""}

    def publish_pending(self) -> None:
        events = self.engine.take_kv_events()
        if events:
            self.publisher.publish(KVEventBatch(ts=time.time(), events=events))

    def close(self) -> None:
        self.publisher.close()


def _error(status: int, message: str, kind: str = "BadRequestError") -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "code": status}}, status=status)


async def tokenize(engine: Engine, request: web.Request) -> web.Response:
    """vLLM's POST /tokenize: `{"model", "prompt", "add_special_tokens"}` or `{"model",
    "messages"}` (chat template applied) -> `{"count", "max_model_len", "tokens", "token_strs"}`;
    the pod's own tokenizer when it has one."""
    try:
        data = await request.json()
    except ValueError:
        return _error(400, "The request body is not valid JSON.")
    if not isinstance(data, dict):
        return _error(400, "The request body must be a JSON object.")
    model = data.get("model")
    if model is not None:
        try:
            engine.resolve_model(model)
        except KeyError:
            return _error(404, f"The model `{model}` does not exist.", "NotFoundError")
    if "messages" in data:
        messages = data["messages"]
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            return _error(400, "messages must be a list of objects.")
        prompt: Any = None
    elif "prompt" in data:
        prompt = data["prompt"]
        if not isinstance(prompt, str) and not (
            isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
        ):
            return _error(400, "prompt must be a string or a list of token ids.")
    else:
        return _error(400, "Either prompt or messages is required.")
    special = data.get("add_special_tokens", True)
    try:
        tokens = token_ids(engine.engine_prompt(prompt, data.get("messages"), special is not False))
    except ValueError as e:  # a tokenizer without a chat template
        return _error(400, str(e))
    return web.json_response(
        {"count": len(tokens), "max_model_len": engine.cfg.max_model_len, "tokens": tokens, "token_strs": None}
    )


async def reset_prefix_cache(pod_kv: Callable[[], PodKVEvents | None], engine: Engine,
                             request: web.Request) -> web.Response:
    """vLLM's POST /reset_prefix_cache (refused with 409 while requests hold blocks); the
    `AllBlocksCleared` is published at once."""
    if not engine.reset_prefix_cache():
        return _error(409, "The prefix cache cannot be reset while requests are running.", "ConflictError")
    kv = pod_kv()
    if kv is not None:
        kv.publish_pending()
    return web.Response(status=200)
