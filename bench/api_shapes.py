"""A workload's chat request as each API a gateway routes sends it, and its stream read back: the
end-to-end driver's `--api` (bench/e2e.py). The conversation is the same; the bytes on the wire
are each API's own.

* `chat`: the body as the workload wrote it, to /v1/chat/completions (or /v1/completions).
* `responses`: /v1/responses as Codex and the Agents SDK send it: `instructions` (the system
  prompt, sent every turn: a previous response's instructions are not carried over) and a
  session's first turn's messages as `input`; every later turn only what is new since the last
  one (the tool's result) and `previous_response_id`, so the conversation lives in the pod's
  store and the gateway must send the turn to the pod that made the previous response.
  Such a turn waits for the previous one's answer (it needs its id), as an agent does.
* `messages`: /v1/messages as Claude Code sends it: `system`, the whole conversation each turn
  (tool results as user turns).
* `mixed`: each session speaks one of the three (by its session id), so the APIs share the pods
  and the agent types' system prompts.

The output stops at the same `max_tokens` on every API (the simulated pods generate exactly that
many), so the runs compare."""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

from ray_epp.simulator import SimRequest
from serve_app.gateway.usage import usage_counts

APIS = ("chat", "responses", "messages", "mixed")
SESSION_HEADER = "x-session-id"


def api_of(api: str, req: SimRequest) -> str:
    """The API `req` is sent over: `api`, or for `mixed` its session's (a request without one: chat)."""
    if api != "mixed":
        return api
    session = req.headers.get(SESSION_HEADER)
    return "chat" if session is None else APIS[zlib.crc32(session.encode()) % 3]


def chains(api: str, req: SimRequest) -> bool:
    """Whether `req`'s turn needs its session's previous response id."""
    return api_of(api, req) == "responses"


def _split(messages: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    system = "\n".join(str(m["content"]) for m in messages if m["role"] == "system")
    return system, [m for m in messages if m["role"] != "system"]


def _turn(message: dict[str, Any]) -> dict[str, str]:
    """A conversation message as a user or assistant turn (a tool's result comes back as a user turn)."""
    return {"role": "assistant" if message["role"] == "assistant" else "user", "content": str(message["content"])}


def request(api: str, req: SimRequest, previous: tuple[SimRequest, str] | None = None) -> tuple[str, dict[str, Any]]:
    """(path, body) of `req` over its API; `previous`: its session's last turn and that turn's
    response id (the Responses API's chaining)."""
    body, api = req.body, api_of(api, req)
    stream = {"stream": True}
    if api == "chat" or "messages" not in body:
        path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
        return path, {**body, **stream, "stream_options": {"include_usage": True}}
    system, turns = _split(body["messages"])
    common = {"model": body["model"], **stream}
    if api == "messages":
        return "/v1/messages", {**common, "system": system, "messages": [_turn(m) for m in turns],
                                "max_tokens": body["max_tokens"]}  # fmt: skip
    if previous is not None:  # only what is new; the pod holds the rest (its own answers included)
        before, response_id = previous
        new = [_turn(m) for m in body["messages"][len(before.body["messages"]) :] if m["role"] != "assistant"]
        return "/v1/responses", {**common, "instructions": system, "input": new, "previous_response_id": response_id,
                                 "max_output_tokens": body["max_tokens"]}  # fmt: skip
    return "/v1/responses", {**common, "instructions": system, "input": [_turn(m) for m in turns],
                             "max_output_tokens": body["max_tokens"]}  # fmt: skip


@dataclass(slots=True)
class StreamReader:
    """One answer's stream events, in any API's names: whether an event carried output text, and
    at the end the usage (prompt, output, cached prompt tokens), the response id, an error."""

    api: str
    usage: dict[str, Any] | None = None
    done: bool = False
    response_id: str | None = None
    error: dict[str, Any] | None = None

    def feed(self, msg: dict[str, Any]) -> bool:
        """Read one event (a `data:` JSON); True when it carried output text."""
        kind = msg.get("type")
        if isinstance(msg.get("error"), dict) or kind in ("error", "response.failed"):  # the gateway's, the API's
            self.error = msg.get("error") if isinstance(msg.get("error"), dict) else msg
            return False
        if kind == "response.output_text.delta" or kind == "content_block_delta":
            return bool(msg.get("delta"))
        if kind in ("response.created", "response.completed"):
            response = msg.get("response") or {}
            self.response_id = response.get("id") or self.response_id
            if kind == "response.completed":
                self.usage, self.done = response.get("usage"), True
            return False
        if kind == "message_start":
            self.usage = dict((msg.get("message") or {}).get("usage") or {})
            return False
        if kind == "message_delta":
            self.usage = {**(self.usage or {}), **(msg.get("usage") or {})}
            return False
        if kind == "message_stop":
            self.done = True
            return False
        if msg.get("usage"):
            self.usage = msg["usage"]
        return any(c.get("text") or (c.get("delta") or {}).get("content") for c in msg.get("choices") or ())

    def counts(self) -> tuple[int, int, int]:
        """(prompt, output, cached prompt tokens) the answer reported; zeros for what it did not."""
        found = usage_counts({"usage": self.usage}) if self.usage else None
        return (found[0], found[1], max(0, found[2])) if found is not None else (0, 0, 0)
