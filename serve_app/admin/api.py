"""The gateway's admin routes: list, add and remove pods at run time (`epp pods`), behind a token.

Off unless the gateway setting `admin_token` is set: then every /admin route answers 404 like an
unknown route, so a gateway without a token shows no admin surface at all. With a token, a request
needs `Authorization: Bearer <admin_token>`: none (or another scheme) is 401, a wrong token 403,
both OpenAI-shaped; the comparison is constant-time. The admin token is not the OpenAI routes'
`api_key`: a client that may send completions may not change the pool.

    GET    /admin/pods                 every pod (state, source, draining, metrics) and the pod
                                       sources' status (a watched file's last error)
    POST   /admin/pods                 {name, address, port, labels}: add, or replace that name
    DELETE /admin/pods/{name}?drain=   drain it (default) or, with drain=false, remove it at once
    GET    /admin/decisions?limit=     the newest recorded decisions (`decision_record_ratio`)
    GET    /admin/decisions/{request_id}  why that request went where it went (`epp explain`)

The datastore actor owns the pod set: every call goes there, so any replica may serve it. A pod that
a managed source (a watched pods file) owns is the source's: changing it here is 409.
Decisions are read from the gateway's decision log actor, so any replica finds any replica's
(serve_app/gateway/decision_record.py)."""

import asyncio
import hmac
import json
import logging
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from actors.launcher import PodsFileError, parse_pods
from actors.pod_source import PodConflict
from serve_app.gateway.decision_record import DecisionRecorder, explained
from serve_app.gateway.errors import GatewayError, bad_request, no_route

log = logging.getLogger("ray_epp.gateway.admin")

MAX_ADMIN_BODY_BYTES = 64 * 1024
DATASTORE_TIMEOUT_S = 30.0


class AdminApi:
    """What the admin routes do in one gateway replica: check the token, call the datastore."""

    def __init__(self, token: str | None, datastore: Any, decisions: DecisionRecorder | None = None) -> None:
        self._expected = f"Bearer {token}".encode() if token else None
        self._datastore = datastore
        self._decisions = decisions

    def check(self, http: Request) -> None:
        if self._expected is None:
            raise no_route(http.method, http.url.path)  # off: as any path the gateway does not serve
        given = http.headers.get("authorization", "")
        if not given.lower().startswith("bearer "):
            raise GatewayError(
                401,
                "the admin routes need 'Authorization: Bearer <admin_token>'",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )
        if not hmac.compare_digest(given.encode(), self._expected):
            raise GatewayError(403, "the admin token is not valid", code="invalid_admin_token")

    async def _call(self, method: str, *args: Any) -> Any:
        try:
            return await asyncio.wait_for(getattr(self._datastore, method).remote(*args), DATASTORE_TIMEOUT_S)
        except PodConflict as err:
            raise GatewayError(409, _cause(err), code="conflict") from None
        except ValueError as err:
            raise bad_request(_cause(err)) from None
        except Exception as err:  # the datastore restarting, or gone
            log.warning("admin: datastore %s failed: %s", method, err)
            raise GatewayError(503, f"the datastore did not answer: {type(err).__name__}") from None

    async def list_pods(self) -> dict[str, Any]:
        return {"pods": await self._call("status"), "sources": await self._call("sources")}

    async def add_pod(self, http: Request) -> dict[str, Any]:
        raw = await http.body()
        if len(raw) > MAX_ADMIN_BODY_BYTES:
            raise GatewayError(413, f"admin request body over {MAX_ADMIN_BODY_BYTES} bytes")
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError):
            raise bad_request("the body must be a JSON pod: {name, address, port, labels}") from None
        try:
            [spec] = parse_pods([data], where="pod")
        except PodsFileError as err:
            raise bad_request(str(err).replace("pod: entry 0", "pod", 1)) from None
        change = await self._call("add_pod", spec.model_dump())
        return {"pod": spec.model_dump(), **change}

    async def remove_pod(self, name: str, http: Request) -> dict[str, Any]:
        value = http.query_params.get("drain", "true").lower()
        if value not in ("true", "false", "1", "0"):
            raise bad_request("'drain' must be true or false", param="drain")
        drain = value in ("true", "1")
        if not await self._call("remove_pod", name, drain):
            raise GatewayError(404, f"no pod named {name!r}", code="NotFound")
        return {"removed": name, "draining": drain}

    def _recorder(self) -> DecisionRecorder:
        if self._decisions is None:
            raise GatewayError(
                404,
                "the decision record is off: set the gateway setting decision_record_ratio (0 < ratio <= 1)",
                code="decision_record_off",
            )
        return self._decisions

    async def decision(self, request_id: str) -> dict[str, Any]:
        recorder = self._recorder()
        try:
            records = await recorder.lookup(request_id)
        except Exception as err:
            raise GatewayError(503, f"the decision log did not answer: {type(err).__name__}") from None
        if not records:
            raise GatewayError(
                404,
                f"no decision recorded for request id {request_id!r}: the record keeps the newest "
                f"{recorder.size} requests, {recorder.ratio:g} of them (decision_record_ratio)",
                code="NotFound",
            )
        return {"request_id": request_id, "decisions": [explained(r) for r in records]}

    async def decisions(self, http: Request) -> dict[str, Any]:
        recorder = self._recorder()
        raw = http.query_params.get("limit", "20")
        if not raw.isdigit() or not 1 <= int(raw) <= recorder.size:
            raise bad_request(f"'limit' must be an integer from 1 to {recorder.size}", param="limit")
        try:
            found = await recorder.recent(int(raw))
        except Exception as err:
            raise GatewayError(503, f"the decision log did not answer: {type(err).__name__}") from None
        found["decisions"] = [_summary(r) for r in found["decisions"]]
        return {**found, "ratio": recorder.ratio}


def _summary(record: dict[str, Any]) -> dict[str, Any]:
    """A decision in one line: who, when, where, and by how much it won."""
    full = explained(record)
    primary = full["profiles"].get(record["primary_profile"] or "", {})
    keys = ("request_id", "at", "model", "gateway", "outcome", "error", "target", "primary_profile")
    return {**{k: record[k] for k in keys}, "margin": primary.get("margin")}


def _cause(err: Exception) -> str:
    """The message of the exception a Ray actor raised (its RayTaskError adds a traceback)."""
    cause = getattr(err, "cause", None)
    return str(cause if cause is not None else err).strip().splitlines()[-1][:500]


def admin_router(api: Callable[[], AdminApi]) -> APIRouter:
    """The /admin routes; `api` gives the serving replica's AdminApi."""
    router = APIRouter(prefix="/admin")

    async def answer(http: Request, action: Callable[[AdminApi], Any], status: int = 200) -> Response:
        admin = api()
        try:
            admin.check(http)
            return JSONResponse(await action(admin), status_code=status)
        except GatewayError as err:
            return err.response()

    @router.get("/pods")
    async def list_pods(request: Request) -> Response:
        return await answer(request, lambda a: a.list_pods())

    @router.post("/pods")
    async def add_pod(request: Request) -> Response:
        return await answer(request, lambda a: a.add_pod(request))

    @router.delete("/pods/{name}")
    async def remove_pod(request: Request, name: str) -> Response:
        return await answer(request, lambda a: a.remove_pod(name, request))

    @router.get("/decisions")
    async def decisions(request: Request) -> Response:
        return await answer(request, lambda a: a.decisions(request))

    @router.get("/decisions/{request_id}")
    async def decision(request: Request, request_id: str) -> Response:
        return await answer(request, lambda a: a.decision(request_id))

    return router
