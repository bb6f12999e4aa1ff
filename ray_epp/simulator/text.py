"""Fake output text: deterministic filler words, one word per generated token."""

from __future__ import annotations

# fmt: off
WORDS = (
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by", "on", "not",
    "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an", "had", "they", "you", "were", "their",
    "one", "all", "we", "can", "her", "has", "there", "been", "if", "more", "when", "will", "would", "who", "so", "no",
    "model", "token", "cache", "prefix", "batch", "decode", "prefill", "route", "queue", "server",
)
# fmt: on


def fake_tokens(seed: int, start: int, end: int) -> str:
    """The text of output tokens [start, end) of a request whose words are chosen by `seed`."""
    n = len(WORDS)
    return "".join(" " + WORDS[(seed + 7 * i) % n] for i in range(start, end))
