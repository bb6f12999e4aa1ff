"""The gateway's routes beside the request path: `/v1/pick` (the decision without forwarding),
`/v1/models`, `/ready` and `/metrics`. Each reads a replica's `GatewayCore`; none forwards a
request to a model server."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from scheduler import SchedulingError
from scheduler.interfaces import LocalResponse
from scheduler.trace import SchedulingTrace
from serve_app.gateway.errors import GatewayError, bad_request, no_route
from serve_app.gateway.intake import SHED_RETRY_AFTER_S as RETRY_AFTER_S
from serve_app.gateway.metrics_page import render_page
from serve_app.gateway.parsing import ParsedRequest, parse_request

if TYPE_CHECKING:
    from serve_app.gateway.core import GatewayCore

DESTINATION_HEADER = "x-gateway-destination-endpoint"
PICK_PATHS = ("/v1/completions", "/v1/chat/completions")


async def pick(core: GatewayCore, http: Request) -> Response:
    """The decision without forwarding, for use behind another proxy (when `pick_api` is on)."""
    if not core.settings.pick_api:
        return no_route(http.method, http.url.path).response()
    intake = core.intake
    admission = intake.let_in(http)
    if isinstance(admission, Response):
        return admission
    parsed: ParsedRequest | None = None
    try:
        raw = await intake.read_body(http, admission.client)
        await core.ensure_ready()
        path = http.query_params.get("path", "/v1/completions")
        if path not in PICK_PATHS:
            raise bad_request("'path' must be /v1/completions or /v1/chat/completions", param="path")
        parsed = parse_request(raw, dict(http.headers), path, core.settings, core.known_models())
        await core.admit(parsed.llm_request, http, len(raw))
        trace = SchedulingTrace() if intake.wants_trace(http) else None
        result = await core.schedule(parsed.llm_request, trace)
    except GatewayError as err:
        return err.response()
    except SchedulingError as err:
        core.settle(parsed.llm_request)  # type: ignore[union-attr]  (parsed before scheduling)
        return GatewayError.from_scheduling(err).response()
    except BaseException:
        if parsed is not None:  # a dispatched request must not hold its queue's window
            core.settle(parsed.llm_request)
        raise
    finally:
        admission.leave()
    # Stateful plugins learn the decision (the prefix index keeps up with proxied traffic), but
    # its response never passes here: count it finished at once, or in-flight ledgers (active
    # requests, prefill backlog) would hold it until their timeout.
    core.tell_pre_request(parsed.llm_request, result)
    core.tell_complete(parsed.llm_request, result.target.name)
    body: dict[str, Any] = result.to_json()
    body["endpoints"] = {
        name: None if r is None else [ep.host_port for ep in r.target_endpoints]
        for name, r in result.profile_results.items()
    }
    if trace is not None:
        body["trace"] = trace.to_json()
    headers = core.lifecycle.response_headers(parsed.llm_request, result)
    headers[DESTINATION_HEADER] = result.target.host_port
    return JSONResponse(body, headers=headers)


async def models(core: GatewayCore) -> Response:
    """A configured Responder's answer (`models-responder`: every pod's own list, as served), or
    without one the ids the datastore knows, owned by the gateway."""
    if core.responders:
        await core.ensure_ready()
        for responder in core.responders:
            answer = responder.respond("GET", "/v1/models", core.view.endpoints)
            if answer is not None:
                return local_response(answer)
    core.ensure_started()
    data = [{"id": m, "object": "model", "owned_by": "ray-epp"} for m in sorted(core.view.models)]
    return JSONResponse({"object": "list", "data": data})


def local_response(answer: LocalResponse) -> Response:
    """A Responder's answer over HTTP: its JSON body, or an OpenAI-shaped error."""
    if 200 <= answer.status < 300:
        return JSONResponse(answer.body, status_code=answer.status)
    headers = {"Retry-After": RETRY_AFTER_S} if answer.status == 503 else None
    return GatewayError(answer.status, str(answer.body), headers=headers).response()


async def ready(core: GatewayCore) -> Response:
    core.ensure_started()
    await core.view.wait_first(2.0)
    n = len(core.view.endpoints)
    return JSONResponse({"ready": n > 0, "ready_endpoints": n}, status_code=200 if n else 503)


async def metrics(core: GatewayCore) -> Response:
    return Response(await render_page(core), media_type="text/plain; version=0.0.4")
