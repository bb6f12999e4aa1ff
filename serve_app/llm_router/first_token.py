"""First tokens a Serve request router can not see, inferred from the queue each replica publishes.

GIE's in-flight ledger (`prefill-backlog-scorer`) counts a request's prompt work until its first
token. A gateway sees that token stream by; a Serve request router sees only `on_request_routed`
and `on_request_completed`, so without this the ledger holds a request's prompt tokens through its
whole decode, and a replica that finished a long prefill long ago still looks backed up: its
prefix group spills to a replica that has to prefill the whole prompt again.

What the router does see: the replica's published engine state (serve_app/llm_router/stats.py), with the
number of requests waiting in its engine's queue and the time it was taken. An engine admits in
arrival order, so of this router's requests routed to the replica before that time, all but the
newest `waiting` have left the queue: their prefill has run (or runs in the engine's current step).
Those are reported as first tokens. Conservative: `waiting` also counts other routers' requests,
so no request is released early by it; a priority-ordered engine breaks the arrival-order rule."""

from __future__ import annotations

from collections import OrderedDict

from scheduler import LLMRequest

# A request routed this long before the replica took its state may not have reached its engine's
# queue yet (the replica forwards it): only older ones are judged by the published queue.
ARRIVAL_SLACK_S = 0.01


class FirstTokenInference:
    """Per replica, this router's routed requests whose first token is not known yet, oldest first."""

    __slots__ = ("_awaiting", "_seen_at")

    def __init__(self) -> None:
        self._awaiting: dict[str, OrderedDict[str, tuple[LLMRequest, float]]] = {}
        self._seen_at: dict[str, float] = {}  # replica -> the state time last judged by

    def routed(self, replica: str, request: LLMRequest, at: float) -> None:
        """`request` was accepted by `replica` at `at` (time.time())."""
        self._awaiting.setdefault(replica, OrderedDict())[request.request_id] = (request, at)

    def completed(self, replica: str, request_id: str) -> None:
        awaiting = self._awaiting.get(replica)
        if awaiting is not None:
            awaiting.pop(request_id, None)

    def published(self, replica: str, waiting: int, taken_at: float) -> list[LLMRequest]:
        """The replica's engine had `waiting` requests queued at `taken_at`: the requests that left
        the queue since it was last judged (their first token is due), no longer awaited."""
        awaiting = self._awaiting.get(replica)
        if not awaiting or taken_at <= self._seen_at.get(replica, 0.0):
            return []
        self._seen_at[replica] = taken_at
        there = [iid for iid, (_, at) in awaiting.items() if at <= taken_at - ARRIVAL_SLACK_S]
        return [awaiting.pop(iid)[0] for iid in there[: max(0, len(there) - waiting)]]

    def forget(self, replicas: set[str]) -> None:
        """Keep only `replicas` (the others went away)."""
        for name in [n for n in self._awaiting if n not in replicas]:
            del self._awaiting[name]
            self._seen_at.pop(name, None)

    def __len__(self) -> int:
        return sum(len(a) for a in self._awaiting.values())
