"""The flow-control harness's tenants arrive as separate clients: a real HTTP server on 127.0.0.1
records each request's peer address (what the gateway's per-client limits key a client by), and
every request comes from the address the harness gave its tenant's client."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bench.e2e import E2EDriver
from bench.flow_control import workload
from bench.flow_control_e2e import KINDS, client_addresses, peak_open
from bench.metrics import OK, SHED, Outcome
from scheduler.flowcontrol.types import FAIRNESS_ID_HEADER

STREAM = (
    b'data: {"choices": [{"index": 0, "text": "a"}]}\n\n'
    b'data: {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}\n\n'
    b"data: [DONE]\n\n"
)


class _Recorder(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the gateway's server: a client's pool reuses them
    seen: list[tuple[str, str, str]]  # (peer address, prompt, fairness id)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        prompt = body.get("prompt") or body["messages"][-1]["content"]
        self.seen.append((self.client_address[0], prompt, self.headers.get(FAIRNESS_ID_HEADER, "")))
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("content-length", str(len(STREAM)))
        self.end_headers()
        self.wfile.write(STREAM)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[tuple[str, list[tuple[str, str, str]]]]:
    seen: list[tuple[str, str, str]] = []
    handler = type("Recorder", (_Recorder,), {"seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler, bind_and_activate=False)
    server.request_queue_size = 512  # the clients' burst of connections (its default: 5)
    server.daemon_threads = True
    server.server_bind()
    server.server_activate()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def _prompt(req) -> str:  # type: ignore[no-untyped-def]
    return req.body.get("prompt") or req.body["messages"][-1]["content"]


def test_each_tenant_arrives_as_its_own_clients(recorder: tuple[str, list[tuple[str, str, str]]]) -> None:
    url, seen = recorder
    labelled = workload(2000.0, 0.1, 0)  # 200 requests in 0.1 s, each kind among them
    source = client_addresses(labelled, 2)
    driver = E2EDriver(warmup=0, timeout_s=10.0, source=lambda r: source[r.request_id])
    run = driver._measure([url], [url], labelled.requests)
    assert all(o.status == OK for o in run.outcomes), run.extra
    by_prompt = {_prompt(r): r.request_id for r in labelled.requests}
    assert len(seen) == len(labelled.requests)
    peers: dict[str, set[str]] = {}
    for peer, prompt, fairness in seen:
        rid = by_prompt[prompt]
        assert peer == source[rid]  # the server saw it from its client's address
        kind = labelled.kind[rid]
        assert fairness == ("" if kind == "critical" else kind)
        peers.setdefault(kind, set()).add(peer)
    # two clients per kind, each kind's own: 127.0.<kind>.<client>
    assert peers == {k: {f"127.0.{i + 1}.1", f"127.0.{i + 1}.2"} for i, k in enumerate(KINDS)}


def test_one_client_sends_everything_from_one_address(recorder: tuple[str, list[tuple[str, str, str]]]) -> None:
    url, seen = recorder
    labelled = workload(2000.0, 0.1, 0)
    run = E2EDriver(warmup=0, timeout_s=10.0)._measure([url], [url], labelled.requests[:20])
    assert all(o.status == OK for o in run.outcomes), run.extra
    assert {peer for peer, _, _ in seen} == {"127.0.0.1"}


def test_a_client_outside_loopback_or_no_clients_is_refused() -> None:
    labelled = workload(2000.0, 0.1, 0)
    with pytest.raises(ValueError, match="1-254"):
        client_addresses(labelled, 0)
    run = E2EDriver(warmup=0, timeout_s=1.0, source=lambda r: "10.0.0.1")
    with pytest.raises(ValueError, match=r"only from 127\.0\.0\.0/8"):
        run._measure(["http://127.0.0.1:1"], [], labelled.requests[:1])


def test_peak_open_counts_one_clients_overlapping_requests() -> None:
    labelled = workload(2000.0, 0.1, 0)
    ids = [r.request_id for r in labelled.requests if labelled.kind[r.request_id] == "flood"][:3]
    outcomes = [
        Outcome(ids[0], OK, arrival=0.0, e2e=2.0),
        Outcome(ids[1], SHED, arrival=1.0, e2e=0.5),  # a refusal is open until it is answered
        Outcome(ids[2], "error", arrival=2.0),  # never answered: open to the end
    ]
    apart = {ids[0]: "127.0.2.1", ids[1]: "127.0.2.2", ids[2]: "127.0.2.1"}
    assert peak_open(outcomes, labelled, None) == {"flood": 2}
    # 0's end at 2.0 comes before 2's arrival at 2.0
    assert peak_open(outcomes, labelled, apart) == {"flood": 1}
