"""What a cluster simulation's router is handed and may answer: the workload's requests, its view of
the pods (their last scraped metrics), a pod name, a (prefill, decode) pair, None (shed) or `HOLD`
(kept, handed back by its `poll`), and the callbacks it may give. Routers and workloads need only
this, not the event loop."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ray_epp.kvevents import KVEventBatch
from ray_epp.simulator.config import ROLE_LABEL
from ray_epp.simulator.report import RequestResult
from ray_epp.simulator.tokens import Prompt, count_tokens, flatten_messages


class _Hold:
    __slots__ = ()

    def __repr__(self) -> str:
        return "HOLD"


HOLD = _Hold()  # a router's answer: "I keep this request; poll() hands it back"
RouteDecision = str | tuple[str | None, str] | _Hold | None


@dataclass(slots=True, eq=False)
class SimRequest:
    """One workload request. `body` is the OpenAI body; `prompt` its flattened text (or token ids)."""

    request_id: str
    arrival_time: float
    model: str
    body: dict[str, Any]
    prompt: Prompt
    prompt_tokens: int
    max_tokens: int
    priority: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    ignore_eos: bool = False
    output_tokens: int | None = None  # exact output length (e.g. replayed traces); else the pod decides

    @classmethod
    def from_body(
        cls,
        request_id: str,
        arrival_time: float,
        body: dict[str, Any],
        *,
        priority: int = 0,
        headers: dict[str, str] | None = None,
        output_tokens: int | None = None,
        default_max_tokens: int = 16,
    ) -> SimRequest:
        """Build from an OpenAI completions (`prompt`) or chat (`messages`) body."""
        prompt: Prompt
        if "messages" in body:
            prompt = flatten_messages(body["messages"])
            max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or default_max_tokens
        else:
            raw = body["prompt"]
            prompt = raw[0] if isinstance(raw, list) and raw and isinstance(raw[0], str) else raw
            max_tokens = body.get("max_tokens") or default_max_tokens
        return cls(
            request_id=request_id,
            arrival_time=arrival_time,
            model=body["model"],
            body=body,
            prompt=prompt,
            prompt_tokens=count_tokens(prompt),
            max_tokens=int(max_tokens),
            priority=priority,
            headers=dict(headers or {}),
            ignore_eos=bool(body.get("ignore_eos", False)),
            output_tokens=output_tokens,
        )


@dataclass(slots=True)
class PodView:
    """What a router sees of a pod: identity and its last scraped metrics (DESIGN.md JSON form)."""

    name: str
    labels: dict[str, str]
    metrics: dict[str, Any]
    scraped_at: float = 0.0

    @property
    def role(self) -> str:
        return self.labels.get(ROLE_LABEL, "both")


@runtime_checkable
class Router(Protocol):
    """A routing policy; `on_complete(request, pod, result)` and `on_first_token(request, pod, now)`
    are optional extra methods."""

    def route(self, request: SimRequest, pods: list[PodView], now: float) -> RouteDecision: ...


RouteFn = Callable[[SimRequest, list[PodView], float], RouteDecision]
CompleteFn = Callable[[SimRequest, str | None, RequestResult], None]
FirstTokenFn = Callable[[SimRequest, str, float], None]
KVEventsFn = Callable[[str, KVEventBatch], None]  # (pod name, batch)
PollFn = Callable[[list[PodView], float], list[tuple[SimRequest, RouteDecision]]]
