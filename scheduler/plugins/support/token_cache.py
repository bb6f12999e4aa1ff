"""Tokenizations of shared prompt prefixes, kept so a hot prefix is not tokenized on every request.

A prompt is cut at fixed points: for each multiple of `chunk_chars`, the last whitespace at or
before it (so the cut depends only on the text before it, and prompts that share that text share
the cut). The tokens of the text before a cut are kept in an LRU keyed by that text's hash. A new
prompt looks for its longest cached cut and tokenizes only the rest, as a piece (no special
tokens): the result is the cached tokens + the piece's. Cutting before a whitespace keeps this
exact for tokenizers whose pre-tokenizer splits there (byte-level BPE: GPT-2, Llama 3, Qwen, ...;
tested against whole-prompt tokenization). The whole prompt's tokens are kept too, so a repeated
prompt costs one lookup. A miss records the cuts it can from the tokenizer's offsets (local
tokenizers); a tokenizer over HTTP gives none, so a miss is one call for the whole prompt, and the
first prompt that reaches a cut an earlier prompt reached too tokenizes the text before that cut
on its own (one more call) and keeps it.

Each kept tokenization is a `TokenRun`: its ids, the cached head it was built on (a prefix hit's
ids are the head's + the rest's), and what consumers derived from the ids, kept with them
(`derived`: the precise index's block keys per block size), so a hot prefix is hashed once too."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import xxhash

Encode = Callable[[str, bool], list[int]]  # (text, add special tokens) -> ids
EncodeOffsets = Callable[[str], tuple[list[int], list[int]]]  # text -> (ids, end offset of each id)

DEFAULT_CHUNK_CHARS = 512
DEFAULT_CAPACITY = 4096


def _key(text: str) -> int:
    return xxhash.xxh3_64_intdigest(text.encode("utf-8", "surrogatepass"))


@dataclass(slots=True, eq=False)
class TokenRun:
    """A kept tokenization. `head`: the kept run whose ids begin these (a prefix hit), or None.
    `derived`: consumers' results computed from `ids`, by their own key (never from anything else)."""

    ids: list[int]
    head: TokenRun | None = None
    derived: dict[Any, Any] = field(default_factory=dict)


@dataclass(slots=True)
class TokenCacheCounts:
    hits: int = 0  # the whole prompt was cached
    prefix_hits: int = 0  # a cached prefix + a tokenized rest
    misses: int = 0


class PrefixTokenCache:
    __slots__ = ("_lru", "_seen", "capacity", "chunk_chars", "counts")

    def __init__(self, chunk_chars: int = DEFAULT_CHUNK_CHARS, capacity: int = DEFAULT_CAPACITY) -> None:
        if chunk_chars <= 0 or capacity <= 0:
            raise ValueError("a token cache needs chunk_chars > 0 and capacity > 0")
        self.chunk_chars = chunk_chars
        self.capacity = capacity
        self._lru: OrderedDict[int, TokenRun] = OrderedDict()
        self._seen: OrderedDict[int, None] = OrderedDict()  # cuts of prompts tokenized whole
        self.counts = TokenCacheCounts()

    def cuts(self, text: str) -> list[int]:
        """The cut points of a text, ascending (each > 0, each < len(text))."""
        out: list[int] = []
        last = 0
        for limit in range(self.chunk_chars, len(text), self.chunk_chars):
            cut = max(text.rfind(" ", last, limit + 1), text.rfind("\n", last, limit + 1))
            if cut > last:
                out.append(cut)
                last = cut
        return out

    def tokens(self, text: str, encode: Encode, encode_offsets: EncodeOffsets | None = None) -> list[int]:
        """The text's token ids (special tokens added as `encode(text, True)` adds them)."""
        return self.run(text, encode, encode_offsets).ids

    def run(self, text: str, encode: Encode, encode_offsets: EncodeOffsets | None = None) -> TokenRun:
        """The text's kept tokenization (made and kept if it was not): `tokens` with its run."""
        whole = _key(text)
        cached = self._get(whole)
        if cached is not None:
            self.counts.hits += 1
            return cached
        cuts = self.cuts(text)
        for cut in reversed(cuts):
            head = self._get(_key(text[:cut]))
            if head is not None:
                self.counts.prefix_hits += 1
                run = TokenRun(head.ids + encode(text[cut:], False), head)
                self._put(whole, run)
                return run
        self.counts.misses += 1
        if encode_offsets is not None:
            ids, ends = encode_offsets(text)
            i = 0
            head_run = None
            for cut in cuts:  # a cut is kept only where a token ends exactly there
                while i < len(ends) and ends[i] < cut:
                    i += 1
                if i < len(ends) and ends[i] == cut:
                    head_run = TokenRun(ids[: i + 1])
                    self._put(_key(text[:cut]), head_run)
            run = TokenRun(ids, head_run)
        else:  # no offsets: a cut another prompt reached too is a shared prefix, worth its own call
            seen = self._seen
            shared = next((c for c in reversed(cuts) if _key(text[:c]) in seen), 0)
            if shared:
                head_run = TokenRun(encode(text[:shared], True))
                self._put(_key(text[:shared]), head_run)
                run = TokenRun(head_run.ids + encode(text[shared:], False), head_run)
            else:
                run = TokenRun(encode(text, True))
            for cut in cuts:
                seen[_key(text[:cut])] = None
                seen.move_to_end(_key(text[:cut]))
            while len(seen) > 4 * self.capacity:
                seen.popitem(last=False)
        self._put(whole, run)
        return run

    def __len__(self) -> int:
        return len(self._lru)

    def _get(self, key: int) -> TokenRun | None:
        run = self._lru.get(key)
        if run is not None:
            self._lru.move_to_end(key)
        return run

    def _put(self, key: int, run: TokenRun) -> None:
        self._lru[key] = run
        self._lru.move_to_end(key)
        while len(self._lru) > self.capacity:
            self._lru.popitem(last=False)
