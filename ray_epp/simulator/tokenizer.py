"""An opt-in real tokenizer for a simulated pod (`PodConfig.tokenizer`: a tokenizer.json path).

With it a pod counts, caches, hashes and publishes the prompt's real token ids, as a vLLM serving
that tokenizer does: a completion prompt is encoded with the special tokens the tokenizer adds
(vLLM's `add_special_tokens=True`), a chat request is rendered with the chat template of the
`tokenizer_config.json` beside the file (jinja2, `add_generation_prompt`) and encoded without
adding any (the template writes them), and `/tokenize` answers the same ids. Without it a pod
keeps the 4-characters-a-token rule (`ray_epp.simulator.tokens`), which every other benchmark relies on.

The `tokenizers` library and jinja2 are imported only when a pod has a tokenizer; nothing is ever
downloaded. One `PodTokenizer` per file serves every pod of the process, and it remembers the
ids of the last `MEMO_CAPACITY` texts (a simulation sends the same prompts to many pods)."""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ray_epp.simulator.tokens import message_parts

MEMO_CAPACITY = 8192


class PodTokenizer:
    __slots__ = ("_bos", "_eos", "_memo", "_template", "_tokenizer", "path")

    def __init__(self, path: str | Path) -> None:
        from tokenizers import Tokenizer

        self.path = Path(path)
        try:
            self._tokenizer = Tokenizer.from_file(str(self.path))
        except Exception as e:  # the library raises a bare Exception for a missing or bad file
            raise ValueError(f"tokenizer {str(self.path)!r}: not a tokenizer.json the library reads: {e}") from e
        self._template: Any = None
        self._bos = self._eos = ""
        config = self.path.with_name("tokenizer_config.json")
        if config.is_file():
            data = json.loads(config.read_text())
            if isinstance(data.get("chat_template"), str):
                import jinja2

                env = jinja2.Environment(autoescape=False, keep_trailing_newline=True)  # a prompt, not HTML
                self._template = env.from_string(data["chat_template"])
                self._bos, self._eos = _token_text(data.get("bos_token")), _token_text(data.get("eos_token"))
        self._memo: OrderedDict[tuple[str, bool], list[int]] = OrderedDict()

    def encode(self, text: str, special: bool = True) -> list[int]:
        """The text's ids (`special`: with the tokens the tokenizer adds, as vLLM's default)."""
        key = (text, special)
        ids = self._memo.get(key)
        if ids is None:
            ids = self._memo[key] = self._tokenizer.encode(text, add_special_tokens=special).ids
            if len(self._memo) > MEMO_CAPACITY:
                self._memo.popitem(last=False)
        else:
            self._memo.move_to_end(key)
        return ids

    def render_chat(self, messages: Sequence[Any]) -> str:
        """The chat prompt as vLLM renders it; ValueError without a chat template (vLLM refuses too)."""
        if self._template is None:
            raise ValueError(f"tokenizer {str(self.path)!r} has no chat template (tokenizer_config.json)")
        msgs = [{"role": role, "content": content} for role, content in message_parts(messages)]
        return self._template.render(messages=msgs, add_generation_prompt=True, bos_token=self._bos,
                                     eos_token=self._eos)  # fmt: skip

    def chat_ids(self, messages: Sequence[Any]) -> list[int]:
        return self.encode(self.render_chat(messages), special=False)


def _token_text(token: Any) -> str:
    if isinstance(token, dict):  # tokenizer_config.json's AddedToken form
        return str(token.get("content", ""))
    return token if isinstance(token, str) else ""


_TOKENIZERS: dict[str, PodTokenizer] = {}


def pod_tokenizer(path: str) -> PodTokenizer:
    """The process's PodTokenizer for this file (loaded once)."""
    key = str(Path(path).expanduser().resolve())
    tok = _TOKENIZERS.get(key)
    if tok is None:
        tok = _TOKENIZERS[key] = PodTokenizer(key)
    return tok
