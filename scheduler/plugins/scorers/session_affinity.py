"""`session-affinity-scorer` (llm-d): route a session's next request to the endpoint that served
the previous one. The gateway puts `x-session-token: <base64 of the endpoint name>` on each
response (`session_token_for`); a request that carries it back scores that endpoint 1, others 0.

llm-d encodes the pod's `namespace/name`; our endpoints have just a name, so the token is the
base64 (standard alphabet, padded) of `Endpoint.name`."""

from __future__ import annotations

import base64
import binascii

from scheduler.cycle_state import CycleState
from scheduler.interfaces import Scorer, ScorerCategory
from scheduler.registry import register
from scheduler.types import Endpoint, LLMRequest

SESSION_TOKEN_HEADER = "x-session-token"


def session_token_for(endpoint_name: str) -> str:
    """The value of the `x-session-token` response header for a response served by this endpoint."""
    return base64.b64encode(endpoint_name.encode()).decode("ascii")


def endpoint_of_session_token(token: str) -> str | None:
    """The endpoint name a session token carries, or None when it is empty or not valid base64."""
    if not token:
        return None
    try:
        return base64.b64decode(token, validate=True).decode()
    except (binascii.Error, ValueError):  # bad base64, or bytes that are not UTF-8
        return None


@register
class SessionAffinityScorer(Scorer):
    type_name = "session-affinity-scorer"
    category = ScorerCategory.AFFINITY

    def score(self, cycle_state: CycleState, request: LLMRequest, endpoints: list[Endpoint]) -> dict[Endpoint, float]:
        previous = endpoint_of_session_token(request.header(SESSION_TOKEN_HEADER))
        return {ep: 1.0 if ep.name == previous else 0.0 for ep in endpoints}
