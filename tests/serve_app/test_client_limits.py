"""The per-client accounting at the door (serve_app/gateway/intake.py, serve_app/gateway/client_limits.py), on real
Starlette requests fed by ASGI receive functions: who a client is, its shares of requests in flight
and of unfinished bodies, and that every way a request can end gives back what it took."""

from __future__ import annotations

import asyncio
import json

import pytest
from starlette.requests import Request

from serve_app.gateway.client_limits import ClientLedger, refusal_bytes
from serve_app.gateway.errors import GatewayError
from serve_app.gateway.intake import RequestIntake
from serve_app.gateway.settings import GatewaySettings

BODY = json.dumps({"model": "m", "prompt": "x"}).encode()


def request(receive, host: str | None = "127.0.0.2", headers: dict[str, str] | None = None) -> Request:
    raw = [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    scope = {
        "type": "http", "method": "POST", "path": "/v1/completions", "headers": raw, "query_string": b"",
        "client": (host, 40000) if host else None,
    }  # fmt: skip
    return Request(scope, receive)


def whole_body(body: bytes = BODY):
    async def receive() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


def first_chunk_then(then: dict | None):
    """One chunk of the body, then `then` (a message), or nothing ever (None: a client that stops)."""
    sent = False

    async def receive() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": b"{", "more_body": True}
        if then is None:
            await asyncio.sleep(3600)
        return then

    return receive


def intake(**settings) -> RequestIntake:
    return RequestIntake(GatewaySettings(**settings))


def empty(door: RequestIntake) -> bool:
    return door.in_flight == 0 and len(door.client_requests) == 0 and len(door.client_bodies) == 0


def test_a_client_is_its_key_its_trusted_fairness_id_or_its_address():
    one_key = intake(api_key="sk-a")
    hdr = {"authorization": "Bearer sk-a", "x-gateway-inference-fairness-id": "tenant-1"}
    assert one_key.client_of(hdr, "10.0.0.1") == "address:10.0.0.1"  # one key names no one
    keys = intake(api_key=["sk-a", "sk-b"])
    assert keys.client_of({"authorization": "Bearer sk-b"}, "10.0.0.1") == "key:1"
    assert keys.client_of({"authorization": "Bearer sk-z"}, "10.0.0.1") == "address:10.0.0.1"
    assert intake(trust_fairness_id=True).client_of(hdr, "10.0.0.1") == "fairness:tenant-1"
    assert intake(trust_fairness_id=True).client_of({}, "10.0.0.1") == "address:10.0.0.1"
    assert intake().client_of(hdr, None) is None  # no address (ext_proc): the replica's limit alone
    long_id = {"x-gateway-inference-fairness-id": "f" * 10_000}
    assert len(intake(trust_fairness_id=True).client_of(long_id, None)) < 200


def test_several_api_keys_each_authenticate():
    door = intake(api_key=["sk-a", "sk-b"])
    door.check_headers({"authorization": "Bearer sk-b"}, 10)
    door.check_headers({"x-api-key": "sk-a"}, 10, anthropic=True)  # as Anthropic's clients send it
    assert door.client_of({"x-api-key": "sk-a"}, "10.0.0.1") == "key:0"
    with pytest.raises(GatewayError):
        door.check_headers({"x-api-key": "sk-a"}, 10)  # only on the Anthropic routes
    with pytest.raises(GatewayError) as err:
        door.check_headers({"authorization": "Bearer sk-c"}, 10)
    assert err.value.status == 401


def test_a_client_over_its_share_gets_429_others_still_enter_and_the_replica_limit_holds():
    door = intake(max_in_flight=5, client_max_in_flight=3)
    mine = [door.enter("address:a") for _ in range(3)]
    with pytest.raises(GatewayError) as err:
        door.enter("address:a")
    body = err.value.body()["error"]
    assert err.value.status == 429 and err.value.headers == {"Retry-After": "1"}
    assert body["type"] == "rate_limit_error" and body["code"] == "rate_limit_exceeded"
    theirs = [door.enter("address:b"), door.enter(None)]
    with pytest.raises(GatewayError) as err:  # the replica is full: 503, and b's try is not kept
        door.enter("address:b")
    assert err.value.status == 503
    assert door.client_requests.held("address:b") == 1
    for admission in [*mine, *theirs]:
        admission.leave()
        admission.leave()  # a second leave counts nothing
    assert empty(door)


def completes(door: RequestIntake, receive, client: str = "address:a") -> int:
    """A request's whole pass at the door: enter, read the body, leave; the status it ends with."""

    async def run() -> int:
        admission = door.enter(client)
        try:
            await door.read_body(request(receive), client)
            return 200
        except GatewayError as err:
            return err.status
        finally:
            admission.leave()

    return asyncio.run(run())


@pytest.mark.parametrize(
    ("receive", "status"),
    [
        (whole_body(), 200),  # completion
        (first_chunk_then({"type": "http.disconnect"}), 400),  # the client left mid-body
        (first_chunk_then(None), 408),  # the body never finished
        (whole_body(b"x" * 2048), 413),  # an error: over max_body_bytes
    ],
    ids=["completion", "client-disconnect", "body-timeout", "error"],
)
def test_every_way_a_request_ends_gives_back_its_shares(receive, status):
    door = intake(body_read_timeout_s=0.05, max_body_bytes=1024)
    assert completes(door, receive) == status
    assert empty(door)


def test_a_cancelled_body_read_gives_back_its_share():
    """Starlette cancels the handler when the client goes away; the finally still runs."""
    door = intake()

    async def run() -> None:
        admission = door.enter("address:a")
        try:
            task = asyncio.create_task(door.read_body(request(first_chunk_then(None)), "address:a"))
            await asyncio.sleep(0.01)
            assert door.client_bodies.held("address:a") == 1
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            admission.leave()

    asyncio.run(run())
    assert empty(door)


def test_unfinished_bodies_have_their_own_share():
    door = intake(client_max_unfinished_bodies=2, body_read_timeout_s=5)

    async def run() -> list[int]:
        async def one() -> int:
            admission = door.enter("address:a")
            try:
                await door.read_body(request(first_chunk_then({"type": "http.disconnect"})), "address:a")
            except GatewayError as err:
                return err.status
            finally:
                admission.leave()
            return 200

        stalled = [asyncio.create_task(door.read_body(request(first_chunk_then(None)), "address:a")) for _ in range(2)]
        await asyncio.sleep(0.01)
        third = await one()  # a's third unfinished body
        other = door.client_bodies.held("address:b")
        for task in stalled:
            task.cancel()
        await asyncio.gather(*stalled, return_exceptions=True)
        return [third, other]

    third, other = asyncio.run(run())
    assert third == 429 and other == 0
    assert len(door.client_bodies) == 0


def test_the_ledger_forgets_a_client_that_holds_nothing():
    ledger = ClientLedger("connections", 2)
    ledger.take("a")
    ledger.take("a")
    with pytest.raises(GatewayError):
        ledger.take("a")
    ledger.give_back("a")
    ledger.give_back("a")
    assert len(ledger) == 0 and ledger.held("a") == 0


def test_a_refused_connection_gets_a_whole_http_answer():
    err = ClientLedger("connections", 0)
    with pytest.raises(GatewayError) as caught:
        err.take("a")
    raw = refusal_bytes(caught.value)
    head, body = raw.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 429 Too Many Requests\r\n")
    assert b"retry-after: 1" in head and b"connection: close" in head
    assert f"content-length: {len(body)}".encode() in head
    assert json.loads(body)["error"]["code"] == "rate_limit_exceeded"
