"""The two ways the token producer gets a prompt's tokens as the engine sees them: a local
`tokenizer.json` (the `tokenizers` library, never a download) and vLLM's `/tokenize` over HTTP
(the chat template applied by the engine's own server for chat requests)."""

from __future__ import annotations

import http.client
import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

TOKENIZE_PATH = "/tokenize"
MAX_RESPONSE_BYTES = 64 * 1024 * 1024
_STALE_CONNECTION = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)


class TokenizerError(Exception):
    """A prompt could not be tokenized (the server failed or answered garbage)."""


def hub_tokenizer_file(model: str) -> Path | None:
    """A model's tokenizer.json in the local Hugging Face cache, if it is there (no download)."""
    home = Path(os.environ.get("HF_HUB_CACHE") or Path(os.environ.get("HF_HOME", "~/.cache/huggingface")) / "hub")
    snapshots = home.expanduser() / f"models--{model.replace('/', '--')}" / "snapshots"
    if not snapshots.is_dir():
        return None
    found = sorted(snapshots.glob("*/tokenizer.json"))
    return found[-1] if found else None


class LocalTokenizer:
    """tokenizer.json via `tokenizers`; chat requests rendered with the chat template of the
    `tokenizer_config.json` beside it (jinja2), when there is one."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer

        self.path = path
        try:
            self.tokenizer = Tokenizer.from_file(str(path))
        except Exception as e:  # the library raises its own Exception type for a bad file
            raise ValueError(f"{path} is not a tokenizer.json the tokenizers library can read: {e}") from e
        self.chat_template = None
        config = path.with_name("tokenizer_config.json")
        if config.is_file():
            data = json.loads(config.read_text())
            template = data.get("chat_template")
            if isinstance(template, str):
                import jinja2

                env = jinja2.Environment(autoescape=False, keep_trailing_newline=True)  # a prompt, not HTML
                self.chat_template = env.from_string(template)
                self.bos = data.get("bos_token") or ""
                self.eos = data.get("eos_token") or ""

    def encode(self, text: str, special: bool) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=special).ids

    def encode_offsets(self, text: str) -> tuple[list[int], list[int]]:
        enc = self.tokenizer.encode(text)
        return enc.ids, [end for _, end in enc.offsets]

    def render_chat(self, messages: list[Any]) -> str | None:
        """The chat prompt as the engine renders it, or None without a chat template."""
        if self.chat_template is None:
            return None
        bos = self.bos if isinstance(self.bos, str) else self.bos.get("content", "")
        eos = self.eos if isinstance(self.eos, str) else self.eos.get("content", "")
        return self.chat_template.render(messages=messages, add_generation_prompt=True, bos_token=bos, eos_token=eos)


class VLLMHttpTokenizer:
    """POST {url}/tokenize, vLLM's tokenizer endpoint: `{"model", "prompt", "add_special_tokens"}`
    for a prompt, `{"model", "messages", "add_generation_prompt": true}` for a chat request (the
    server applies the model's chat template); the answer's `tokens` are the ids. One kept-alive
    connection, re-opened after an error; bounded by `timeout_s` per call."""

    def __init__(self, url: str, model: str, timeout_s: float, chat_timeout_s: float) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"vllm.url {url!r} is not an http(s) URL")
        self.url = url
        self.model = model
        self.timeout_s = timeout_s
        self.chat_timeout_s = chat_timeout_s
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._https else 80)
        self._base = parts.path.rstrip("/")
        self._conn: http.client.HTTPConnection | None = None
        self.calls = 0

    def encode(self, text: str, special: bool) -> list[int]:
        return self._post({"model": self.model, "prompt": text, "add_special_tokens": special}, self.timeout_s)

    def encode_chat(self, messages: list[Any]) -> list[int]:
        body = {"model": self.model, "messages": messages, "add_generation_prompt": True}
        return self._post(body, max(self.timeout_s, self.chat_timeout_s))

    def _post(self, body: dict[str, Any], timeout: float) -> list[int]:
        data = json.dumps(body).encode()
        self.calls += 1
        for attempt in (0, 1):  # a kept-alive connection the server closed is re-opened once
            conn = self._connection(timeout)
            try:
                conn.request("POST", self._base + TOKENIZE_PATH, data, {"Content-Type": "application/json"})
                resp = conn.getresponse()
                raw = resp.read(MAX_RESPONSE_BYTES + 1)
            except (OSError, http.client.HTTPException) as e:
                self.close()
                if attempt == 0 and isinstance(e, _STALE_CONNECTION):
                    continue
                raise TokenizerError(f"{self.url}{TOKENIZE_PATH}: {type(e).__name__}: {e}") from e
            break
        if resp.status != 200:
            raise TokenizerError(f"{self.url}{TOKENIZE_PATH} answered {resp.status}: {raw[:200]!r}")
        if len(raw) > MAX_RESPONSE_BYTES:
            self.close()
            raise TokenizerError(f"{self.url}{TOKENIZE_PATH}: answer over {MAX_RESPONSE_BYTES} bytes")
        try:
            tokens = json.loads(raw)["tokens"]
        except (ValueError, KeyError, TypeError) as e:
            raise TokenizerError(f"{self.url}{TOKENIZE_PATH}: not a tokenize answer: {raw[:200]!r}") from e
        if not isinstance(tokens, list) or not all(type(t) is int for t in tokens):
            raise TokenizerError(f"{self.url}{TOKENIZE_PATH}: `tokens` is not a list of integers")
        return tokens

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        if self._conn is None:
            cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            self._conn = cls(self._host, self._port, timeout=timeout)
        else:
            self._conn.timeout = timeout
            if self._conn.sock is not None:
                self._conn.sock.settimeout(timeout)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
