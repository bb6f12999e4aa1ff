"""The Responses API through the gateway: `POST /v1/responses` is scheduled like chat (its token
view: serve_app/gateway/api_views.py), and a stateful follow-up is pinned. A model server keeps the
responses it made in its own store, so a request naming `previous_response_id`, and
`GET` / `DELETE /v1/responses/{id}` and `POST /v1/responses/{id}/cancel` (a `background`
response), must reach the pod that made that response.

The pins (response id → pod name) live in the datastore actor (actors/response_pins.py): one
actor every replica calls, so a conversation stays on its pod whichever replica a turn reaches.
A response is pinned before its answer reaches the client, so the next turn always finds it.

The errors a client can meet here, each OpenAI-shaped and naming `previous_response_id` or the id:
404 `response_not_found` (no pod is known to hold it: unknown, expired, or made elsewhere), 410
`response_pod_gone` (its pod has left the pool, and its store with it), 503 `response_pod_unavailable`
(its pod is in the pool but takes no request now: starting, stale, unhealthy or draining)."""

from __future__ import annotations

import asyncio
import re
import time
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response

from scheduler import Endpoint
from serve_app.gateway.api_views import RESPONSES_PATH
from serve_app.gateway.errors import GatewayError
from serve_app.gateway.forwarder import UpstreamUnavailable, response_headers
from serve_app.gateway.intake import SHED_RETRY_AFTER_S
from serve_app.gateway.parsing import ParsedRequest, forward_headers
from serve_app.gateway.side_routes import DESTINATION_HEADER

if TYPE_CHECKING:
    from serve_app.gateway.core import GatewayCore

PIN_CALL_TIMEOUT_S = 5.0
# A pod the datastore has routable may be missing from a replica's view for a moment (a pod that
# was stale a moment ago, the view a version behind): a follow-up waits this long for the view.
VIEW_CATCH_UP_S = 2.0
VIEW_POLL_S = 0.05
_ID = re.compile(rb'"id"\s*:\s*"([^"]+)"')  # a stream's first id: its response.created event's response
ID_SEARCH_BYTES = 65536  # how much of a stream's start may hold the response's id


class ResponsesRoute:
    """One `POST /v1/responses` request's hooks on the gateway's path (serve_app/gateway/route_hooks.py)."""

    def __init__(self, core: GatewayCore) -> None:
        self.core = core
        self._seen = b""
        self._pinned = False

    @classmethod
    async def create(cls, core: GatewayCore, http: Request) -> Response:
        return await core.handle(http, RESPONSES_PATH, cls(core))

    async def prepare(self, parsed: ParsedRequest) -> None:
        """A follow-up may go only to the pod that holds its previous response."""
        req = parsed.llm_request
        previous = req.body.get("previous_response_id")
        if previous is None:
            return
        pod = await pinned_endpoint(self.core, previous, "previous_response_id")
        req.excluded_endpoints = frozenset(e.name for e in self.core.view.endpoints if e.name != pod.name)

    async def answered(self, endpoint: str, data: bytes) -> None:
        """Pin the response this answer carries (a JSON body's id, or a stream's first id)."""
        if self._pinned:
            return
        self._seen += data[: ID_SEARCH_BYTES - len(self._seen)]
        found = _ID.search(self._seen)
        if found is None:
            if len(self._seen) >= ID_SEARCH_BYTES:
                self._pinned = True  # no id in the answer's start: nothing to pin
            return
        self._pinned = True
        await _call(self.core, "pin_response", found.group(1).decode(), endpoint)

    def error_response(self, err: GatewayError) -> Response:
        return err.response()

    @staticmethod
    async def stored(core: GatewayCore, http: Request, response_id: str, action: str = "") -> Response:
        """`GET` / `DELETE /v1/responses/{id}` and `POST /v1/responses/{id}/cancel` (`action`) at the
        pod that made the response (a delete drops its pin; a cancel keeps it: the cancelled
        response stays in the pod's store)."""
        admission = core.intake.let_in(http)
        if isinstance(admission, Response):
            return admission
        try:
            body = await core.intake.read_body(http, admission.client) if http.method == "POST" else b""
            await core.ensure_ready()
            pod = await pinned_endpoint(core, response_id, "response_id")
            query = http.url.query
            path = f"{RESPONSES_PATH}/{response_id}{action}" + (f"?{query}" if query else "")
            try:
                upstream = await core.forwarder.open(
                    pod, path, body, forward_headers(dict(http.headers)), method=http.method
                )
            except UpstreamUnavailable as err:
                raise _unavailable(response_id, "response_id", str(err)) from None
            try:
                body = await upstream.read()
            finally:
                upstream.release()
            if http.method == "DELETE" and upstream.status == 200:
                await unpin_response(core, response_id)
            headers = response_headers(upstream)
            headers[DESTINATION_HEADER] = pod.host_port
            return Response(body, status_code=upstream.status, headers=headers)
        except GatewayError as err:
            return err.response()
        finally:
            admission.leave()


async def pinned_endpoint(core: GatewayCore, response_id: str, param: str) -> Endpoint:
    """The routable pod that made `response_id`, or the GatewayError that says why there is none."""
    pod, state = await _call(core, "response_pod", response_id)
    if pod is None:
        raise GatewayError(
            404,
            f"no pod is known to hold response {response_id!r}: it was not made through this gateway, "
            "or its pin expired",
            code="response_not_found",
            param=param,
        )
    if state is None:
        raise GatewayError(
            410,
            f"response {response_id!r} was made by pod {pod!r}, which has left the pool; the response "
            "and its conversation were stored on that pod and are gone",
            code="response_pod_gone",
            param=param,
        )
    endpoint = await _in_view(core, pod, VIEW_CATCH_UP_S if state == "ready" else 0.0)
    if endpoint is not None:
        return endpoint
    if state == "ready":  # the datastore has it routable; this replica's view did not catch up
        raise _unavailable(response_id, param, f"pod {pod!r} is not yet in this gateway replica's view of the pool")
    raise _unavailable(response_id, param, f"pod {pod!r} is {state}")


async def _in_view(core: GatewayCore, pod: str, wait_s: float) -> Endpoint | None:
    """The pod's endpoint in the replica's view, waiting up to `wait_s` for the view (long-polled
    from the datastore) to take a version that holds it."""
    deadline = time.monotonic() + wait_s
    while True:
        for endpoint in core.view.endpoints:
            if endpoint.name == pod:
                return endpoint
        if time.monotonic() >= deadline:
            return None
        await asyncio.sleep(VIEW_POLL_S)


async def unpin_response(core: GatewayCore, response_id: str) -> None:
    """Its pod deleted the response: no request goes there for it any more."""
    await _call(core, "pin_response", response_id, None)


def _unavailable(response_id: str, param: str, why: str) -> GatewayError:
    return GatewayError(
        503,
        f"response {response_id!r} is stored on a pod that can not take requests now ({why}); retry later",
        code="response_pod_unavailable",
        param=param,
        headers={"Retry-After": SHED_RETRY_AFTER_S},
    )


async def _call(core: GatewayCore, method: str, *args: object) -> tuple:
    """A call to the datastore actor, which keeps the pins; a 503 when it does not answer in time."""
    try:
        async with asyncio.timeout(PIN_CALL_TIMEOUT_S):
            return await getattr(core.datastore, method).remote(*args)
    except TimeoutError:
        raise GatewayError(503, "the response pins did not answer in time", code="ServiceUnavailable") from None
