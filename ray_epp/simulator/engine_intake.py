"""What a simulated pod makes of a request before it queues: the LoRA adapter its model name
selects, its prompt as the pod tokenizes it, vLLM's admission errors (a 400), and the engine request
with its block hashes. Apart from the engine's stepping, which never sees a prompt."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from ray_epp.kvevents import BlockHasher
from ray_epp.simulator.config import PodConfig
from ray_epp.simulator.engine_request import EngineRequest
from ray_epp.simulator.kv_cache import KVCache
from ray_epp.simulator.lora import LoraSlots
from ray_epp.simulator.tokenizer import PodTokenizer
from ray_epp.simulator.tokens import Prompt, block_hashes, count_tokens, flatten_messages, token_ids


class RequestIntake:
    """The engine's request-facing half (`Engine` inherits it): reads the engine's configuration,
    tokenizer, KV cache size, adapters and random generator, and changes nothing."""

    cfg: PodConfig
    block_size: int
    kv: KVCache
    lora: LoraSlots
    adapters: dict[str, str]
    hasher: BlockHasher | None
    tokenizer: PodTokenizer | None
    rng: random.Random

    def resolve_model(self, model: str) -> str | None:
        """The LoRA adapter a model name selects (None for the base model); KeyError if unknown."""
        if model == self.cfg.model:
            return None
        if model in self.adapters and self.lora.max_loras > 0:
            return model
        raise KeyError(model)

    def engine_prompt(
        self, prompt: Prompt | None, messages: Sequence[Any] | None = None, special: bool = True
    ) -> Prompt:
        """The prompt as this pod sees it. With a tokenizer: its real token ids (chat messages
        rendered with the tokenizer's chat template; `special`: a text prompt gets the tokens the
        tokenizer adds), ValueError if it can not render them. Without: the prompt as given (chat
        messages flattened), 4 characters a token."""
        tok = self.tokenizer
        if tok is None:
            return prompt if prompt is not None else flatten_messages(messages or [])
        if messages is not None:
            return tok.chat_ids(messages)
        return tok.encode(prompt, special) if isinstance(prompt, str) else list(prompt or [])

    def check(self, prompt_tokens: int, max_tokens: int) -> tuple[str, str] | None:
        """vLLM's admission errors (a 400) as (message, offending parameter), or None."""
        if prompt_tokens <= 0:
            return "The prompt cannot be empty.", "prompt"
        limit = self.cfg.max_model_len
        if prompt_tokens + max_tokens > limit:
            return (
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, {max_tokens} in the "
                f"completion). Please reduce the length of the messages or completion.",
                "prompt" if prompt_tokens >= limit else "max_tokens",
            )
        if -(-(prompt_tokens + max_tokens) // self.block_size) > self.kv.num_blocks:
            return f"The request needs more KV cache than the server has ({self.kv.num_blocks} blocks).", "max_tokens"
        return None

    def new_request(
        self,
        request_id: str,
        prompt: Prompt,
        max_tokens: int,
        arrival: float,
        *,
        lora: str | None = None,
        ignore_eos: bool = False,
        output_len: int | None = None,
        remote_prefill: bool = False,
        remote_decode: bool = False,
        hashes: list[int] | None = None,
    ) -> EngineRequest:
        """Build a request (hashing its prompt blocks once); `output_len` forces the output length."""
        n_prompt = count_tokens(prompt)
        if remote_decode:
            out = 1  # a P/D prefill stops after the first token
        elif output_len is not None:
            out = max(1, min(output_len, max_tokens))
        elif self.cfg.output_length == "random" and not ignore_eos:
            out = self.rng.randint(1, max_tokens)
        else:
            out = max_tokens
        tokens = None
        if self.hasher is not None:
            tokens = token_ids(prompt)
            hashes = self.hasher.hashes(tokens, lora_name=lora)
        elif hashes is None:
            hashes = block_hashes(prompt, self.block_size, lora)
        return EngineRequest(
            request_id=request_id,
            prompt_tokens=n_prompt,
            max_tokens=max_tokens,
            output_len=out,
            block_hashes=hashes,
            arrival=arrival,
            lora=lora,
            remote_prefill=remote_prefill,
            remote_decode=remote_decode,
            token_ids=tokens,
        )
