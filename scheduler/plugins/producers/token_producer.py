"""`token-producer`: the prompt's token ids as the engine sees them, for the precise prefix producer
(llm-d's token producer, pkg/epp/framework/plugins/requestcontrol/dataproducer/tokenizer).

Two backends. `vllm` (llm-d's: `modelName`, `vllm.url`, `vllm.timeout`, `vllm.mmTimeout`): vLLM's
`/tokenize` over HTTP, the chat template applied by the server for chat requests. `local` (Ray
EPP's): a `tokenizer.json` read with the `tokenizers` library, from `local.tokenizerPath` or, for
`local.modelName`, the local Hugging Face cache; nothing is downloaded, so a model not on disk is a
load-time error saying so. Chat requests are rendered with the chat template of the
`tokenizer_config.json` next to the file.

A Producer: it writes the prompt's token ids under PROMPT_TOKENS (scheduler/plugins/support/
tokenized.py) in the request's derived data, which the precise and burst prefix producers consume,
so it runs before them: in a profile, before the precise producer; where the request arrives, before
the burst producer's window (config.data_flow.preparing_producers). Tokenizations are cached per
prefix (scheduler.plugins.support.token_cache): a hot prefix is tokenized once, then only each
request's rest is; one tokenization runs at a time (the cache and the HTTP connection are shared, and
the gateway tokenizes off its event loop). Beside the tokens, the cache's run they came from (where
the precise index keeps a hot prefix's block keys). A failed tokenization is logged, counted and
leaves the key absent: the consumers then score approximately (the request is never failed for it,
as llm-d's Director logs and continues)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from scheduler.body_fields import PROMPT_FIELDS
from scheduler.cycle_state import CycleState
from scheduler.duration import parse_duration
from scheduler.interfaces import Parameters, PluginHandle, Producer
from scheduler.plugins.support.token_cache import DEFAULT_CAPACITY, DEFAULT_CHUNK_CHARS, PrefixTokenCache, TokenRun
from scheduler.plugins.support.tokenized import PROMPT_TOKENS, request_tokens, set_request_tokens
from scheduler.plugins.support.tokenizer_backends import (
    LocalTokenizer,
    TokenizerError,
    VLLMHttpTokenizer,
    hub_tokenizer_file,
)
from scheduler.registry import register
from scheduler.types import Endpoint, LLMRequest

log = logging.getLogger(__name__)


class VLLMConfig(Parameters):
    url: str = "http://localhost:8000"
    timeout: str = "5s"
    mm_timeout: str = Field(default="30s", alias="mmTimeout")

    @field_validator("timeout", "mm_timeout")
    @classmethod
    def _duration(cls, value: str) -> str:
        if parse_duration(value) <= 0:
            raise ValueError(f"must be a positive duration, got {value!r}")
        return value


class LocalConfig(Parameters):
    tokenizer_path: str = Field(default="", alias="tokenizerPath")
    model_name: str = Field(default="", alias="modelName")


class TokenProducerParameters(Parameters):
    model_name: str = Field(default="", alias="modelName")
    vllm: VLLMConfig | None = None
    local: LocalConfig | None = None
    cache_chunk_chars: int = Field(default=DEFAULT_CHUNK_CHARS, alias="cacheChunkChars", gt=0)
    cache_size: int = Field(default=DEFAULT_CAPACITY, alias="cacheSize", gt=0)

    @model_validator(mode="after")
    def _one_backend(self) -> TokenProducerParameters:
        if self.vllm is not None and self.local is not None:
            raise ValueError("give one backend: `vllm` (a tokenize server) or `local` (a tokenizer.json)")
        if self.local is None and not self.model_name:
            raise ValueError("modelName is required for the vllm backend (the model the server tokenizes for)")
        if self.local is not None and not (self.local.tokenizer_path or self.local.model_name or self.model_name):
            raise ValueError("local needs tokenizerPath (a tokenizer.json) or a modelName in the local cache")
        return self


@register
class TokenProducer(Producer):
    type_name = "token-producer"
    body_fields = PROMPT_FIELDS
    Parameters = TokenProducerParameters

    def setup(self, handle: PluginHandle) -> None:
        p: TokenProducerParameters = self.params
        self.produces = (PROMPT_TOKENS.of(self.name),)
        self.cache = PrefixTokenCache(p.cache_chunk_chars, p.cache_size)
        self._lock = threading.Lock()
        self.failures = 0
        self.local: LocalTokenizer | None = None
        self.http: VLLMHttpTokenizer | None = None
        if p.local is not None:
            self.local = LocalTokenizer(self._tokenizer_file(p))
        else:
            v = p.vllm or VLLMConfig()
            self.http = VLLMHttpTokenizer(v.url, p.model_name, parse_duration(v.timeout), parse_duration(v.mm_timeout))

    @staticmethod
    def _tokenizer_file(p: TokenProducerParameters) -> Path:
        assert p.local is not None
        if p.local.tokenizer_path:
            path = Path(p.local.tokenizer_path).expanduser()
            if not path.is_file():
                raise ValueError(f"local.tokenizerPath {str(path)!r} is not a file")
            return path
        model = p.local.model_name or p.model_name
        found = hub_tokenizer_file(model)
        if found is None:
            raise ValueError(
                f"the tokenizer of {model!r} is not in the local Hugging Face cache and would need a download, "
                "which Ray EPP never does at run time; download it beforehand or give local.tokenizerPath"
            )
        return found

    def produce(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> None:
        self.tokens(request)  # kept in the request's derived data, where its consumers read them

    def tokens(self, request: LLMRequest) -> list[int] | None:
        """The request's prompt tokens (kept in its derived data), or None if they can not be had."""
        key = self.produces[0]
        tokens = request_tokens(request, key)
        if tokens is not None:
            return tokens
        try:
            with self._lock:
                run = self._tokenize(request.body)
        except (TokenizerError, ValueError, TypeError) as e:
            self.failures += 1
            log.warning("token-producer %s: %s", self.name, e)
            return None
        if run is None:
            return None
        tokens, kept = (run, None) if isinstance(run, list) else (run.ids, run)
        set_request_tokens(request, tokens, kept, key)
        return tokens

    def _tokenize(self, body: dict[str, Any]) -> TokenRun | list[int] | None:
        """The kept tokenization (the token cache's run), bare ids (uncached), or None."""
        messages = body.get("messages")
        if messages is not None:
            if self.http is not None:
                return self.http.encode_chat(messages)
            assert self.local is not None
            text = self.local.render_chat(messages)
            if text is None:
                return None  # no chat template beside the tokenizer: scored approximately
            encode = self.local.encode
            return self.cache.run(text, lambda t, _special: encode(t, False))  # the template wrote the specials
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            return None  # token-id or batched prompts: not tokenized here
        if self.local is not None:
            return self.cache.run(prompt, self.local.encode, self.local.encode_offsets)
        assert self.http is not None
        return self.cache.run(prompt, self.http.encode)

    def info(self) -> dict[str, Any]:
        c = self.cache.counts
        return {"hits": c.hits, "prefix_hits": c.prefix_hits, "misses": c.misses, "failures": self.failures}
