"""`cache-pressure-drift`: the cache-pressure shape served by pods that tokenize as a real vLLM
does, with content whose characters-per-token is not the router's estimate of 4.

What changes against `cache-pressure`, and why an operator meets each:

* **The engine's tokenizer, not 4 characters a token.** The pods tokenize with the bench's real
  byte-level BPE (`bench/tokenizer_fixture.py`, `PodConfig.tokenizer`): they count, cache, evict
  and publish real token ids. The approximate index still cuts text into 64-character blocks and
  sizes each pod's LRU as `num_gpu_blocks` of them, so what it believes a pod holds differs from
  what the pod holds by the content's true ratio.
* **Two kinds of content in one pool.** Half the groups are English prose (words of the
  tokenizer's own training text: ~4.4 characters a token, a little above the estimate), half are
  hex (text the tokenizer was not trained on, ~2.7 characters a token, as code or another language
  is to a model's tokenizer). One deployment serving both is ordinary, and no single
  characters-per-token constant fits both.
* **Chat requests.** The system prompt is the group's shared prefix, the question the user turn;
  the engine renders them with its chat template (BOS, role tags) before tokenizing, which the
  router's text estimate never sees (it keys on the messages' JSON).

Lengths are those of `cache-pressure` in characters (a system prompt of 8,192 characters and a
512-character question: 2,048 + 128 tokens by the estimate, so the approximate index sees the same
sizes as there), 128 output tokens, 384 groups x 4 prompts drawn at random, 8 pods of 2,048 blocks.
Not modelled here: blocks cached for prompts the router never routed, engine restarts."""

from __future__ import annotations

import random

from bench.tokenizer_fixture import CORPUS
from bench.workloads.common import completion_request, poisson_arrivals, random_words, seeded
from bench.workloads.shared_prefix import CACHE_PRESSURE, SharedPrefixSpec
from ray_epp.simulator import SimRequest

CHARS_ESTIMATE = 4  # the router's characters per token: what the lengths are given in
_WORDS = " ".join(CORPUS).split()


def prose(rng: random.Random, chars: int) -> str:
    """`chars` characters of the tokenizer's own English words."""
    return random_words(rng, _WORDS, chars)


def hex_text(rng: random.Random, chars: int) -> str:
    return rng.randbytes(-(-chars // 2)).hex()[:chars]


def drift_workload(
    rate: float, seed: int = 0, num_requests: int | None = None, spec: SharedPrefixSpec = CACHE_PRESSURE
) -> list[SimRequest]:
    """Chat requests, group g's content prose for even g and hex for odd g (see module docstring)."""
    n = spec.num_requests if num_requests is None else num_requests
    rng = seeded(seed, "cache-pressure-drift")
    sys_chars = spec.tokens(spec.system_tokens) * CHARS_ESTIMATE
    q_chars = spec.tokens(spec.question_tokens) * CHARS_ESTIMATE
    prompts: list[tuple[str, str]] = []
    for g in range(spec.groups):
        text = prose if g % 2 == 0 else hex_text
        system = text(rng, sys_chars)
        prompts += [(system, text(rng, q_chars)) for _ in range(spec.prompts_per_group)]
    chosen = [rng.choice(prompts) for _ in range(n)]
    times = poisson_arrivals(seeded(seed, "arrivals"), n, rate)
    out_n = spec.tokens(spec.output_tokens)
    return [
        completion_request(i, t, "", out_n, messages=[{"role": "system", "content": s}, {"role": "user", "content": q}])
        for i, (t, (s, q)) in enumerate(zip(times, chosen, strict=True))
    ]
