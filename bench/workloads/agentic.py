"""Agentic traffic: sessions of tool-call loops, as coding agents and agent frameworks send them.

A session is one agent working on one task. Its first request is the agent's system prompt (its
instructions and tool definitions, shared by every session of the same agent type) and the
user's task; the model answers with a short tool call; the tool's result comes back as the next
message, and the next request is the whole conversation so far. So a session's prompt grows turn
by turn (every turn is a prefix-cache hit on the last one's prompt and answer, when it lands where
that one ran), outputs are short (tool-call JSON) but for the final answer, and the time between
turns is the tool's run time, not a person's. A few sessions are long-context ones whose tool
results are large (a file read, a search result), up to the pool's context limit.

Timing is open-loop as the ShareGPT workload's is: the next turn arrives after the previous one's
nominal generation time (output tokens x `nominal_itl_s`) plus an exponential tool time (mean
`tool_time_s`). Sessions start with Poisson arrivals from `warmup_s` before the run, keeping only
the turns inside it, so the request rate is steady. Every request carries `x-session-id` (its
session) and `x-agent-type` (its agent), the identity hints llm-d's and Dynamo's routers read;
none of the policies measured here reads them.

Text is random hex (4 characters a token), so the only shared prefixes are the ones built in."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

from bench.workloads.common import completion_request, random_text, seeded
from ray_epp.simulator import SimRequest

TEMPLATE_TOKENS = 24  # a message's chat-template markers (at most), counted against the context limit


@dataclass(frozen=True, slots=True)
class AgenticSpec:
    num_requests: int = 1500
    agent_types: int = 4  # distinct system prompts (tool sets), shared by their sessions
    system_tokens: int = 3000  # instructions + tool definitions
    task_tokens: int = 300
    min_turns: int = 4  # tool calls before the final answer
    max_turns: int = 16
    tool_call_tokens: tuple[int, int] = (30, 150)  # a turn's output: one tool call
    tool_result_tokens: tuple[int, int] = (100, 1000)
    final_answer_tokens: tuple[int, int] = (200, 500)
    long_context_share: float = 0.1  # sessions whose tool results are large
    long_tool_result_tokens: tuple[int, int] = (1500, 3000)
    max_total_tokens: int = 8192  # the simulated pod's max_model_len: a session ends before it
    tool_time_s: float = 1.0  # mean time a tool runs between turns
    nominal_itl_s: float = 0.02
    warmup_s: float = 60.0


def agentic_workload(rate: float, seed: int = 0, spec: AgenticSpec | None = None) -> list[SimRequest]:
    """About `spec.num_requests` requests at a mean rate `rate` (<= 0: whole sessions at t=0)."""
    spec = spec or AgenticSpec()
    text, arr = seeded(seed, "agentic"), seeded(seed, "arrivals")
    systems = [f"[agent {a}] " + random_text(text, spec.system_tokens) for a in range(spec.agent_types)]
    timed: list[tuple[float, list[dict[str, str]], int, dict[str, str]]] = []
    sessions = 0

    def add(start: float, end: float) -> None:
        nonlocal sessions
        sessions += 1
        turns = session(spec, text, systems, f"s{seed}-{sessions}")
        t = start
        for messages, n_out, headers in turns:
            if 0.0 <= t < end:
                timed.append((t, messages, n_out, headers))
            t += n_out * spec.nominal_itl_s + arr.expovariate(1.0 / spec.tool_time_s)

    if rate <= 0:
        while len(timed) < spec.num_requests:
            add(0.0, math.inf)
    else:
        probe = seeded(seed, "agentic-turns")  # the mean session length, from a sample of sessions
        mean_turns = sum(len(session(spec, probe, systems, "probe")) for _ in range(200)) / 200
        end = spec.num_requests / rate
        t = -spec.warmup_s
        while (t := t + arr.expovariate(rate / mean_turns)) < end:
            add(t, end)
    timed.sort(key=lambda x: x[0])
    out = []
    for i, (at, messages, n_out, headers) in enumerate(timed):
        req = completion_request(i, at, "", n_out, messages=messages)
        req.headers.update(headers)
        out.append(req)
    return out


def session(
    spec: AgenticSpec, rng: random.Random, systems: list[str], session_id: str
) -> list[tuple[list[dict[str, str]], int, dict[str, str]]]:
    """One session's turns: (the messages sent, the output tokens asked, the headers)."""
    agent = rng.randrange(len(systems))
    long_context = rng.random() < spec.long_context_share
    results = spec.long_tool_result_tokens if long_context else spec.tool_result_tokens
    headers = {"x-session-id": session_id, "x-agent-type": f"agent-{agent}"}
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": systems[agent]},
        {"role": "user", "content": random_text(rng, spec.task_tokens)},
    ]
    used = spec.system_tokens + spec.task_tokens + 3 * TEMPLATE_TOKENS
    turns = []
    calls = rng.randint(spec.min_turns, spec.max_turns)
    for k in range(calls + 1):
        final = k == calls
        n_out = rng.randint(*(spec.final_answer_tokens if final else spec.tool_call_tokens))
        if used + n_out > spec.max_total_tokens:
            break
        turns.append(([dict(m) for m in messages], n_out, headers))
        if final:
            break
        result = rng.randint(*results)
        used += n_out + result + 2 * TEMPLATE_TOKENS
        messages.append({"role": "assistant", "content": random_text(rng, n_out)})
        # a tool message names the call it answers: OpenAI's schema requires it (SMG refuses the request without)
        call = f"call-{session_id}-{k}"
        messages.append({"role": "tool", "tool_call_id": call, "content": random_text(rng, result)})
    return turns
