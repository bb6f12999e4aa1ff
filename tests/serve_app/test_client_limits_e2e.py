"""Per-client limits at a real gateway's door: one client (source address 127.0.0.2) opens more
idle, unfinished bodies than the replica's whole in-flight limit, while another client (127.0.0.1)
keeps being served. Small limits keep it cheap: 16 in flight per replica, 8 per client, 4
unfinished bodies and 12 connections per client, a 3 s body deadline."""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from urllib.parse import urlsplit

import httpx
import pytest

from tests.serve_app.deployments import sim_pods, start_deployment, wait_until

pytestmark = pytest.mark.ray

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
SETTINGS = {
    "max_in_flight": 16,
    "client_max_in_flight": 8,
    "client_max_unfinished_bodies": 4,
    "client_max_connections": 12,
    "body_read_timeout_s": 3.0,
}
IDLE = 20  # more than max_in_flight


@pytest.fixture(scope="module")
def sim():
    yield from sim_pods(1, seed=5, max_num_seqs=8)


@pytest.fixture(scope="module")
def gateway(ray_session, sim):
    dep = start_deployment(sim, settings=SETTINGS)
    with httpx.Client(base_url=dep.url, timeout=10) as c:
        wait_until(lambda: c.get("/ready").json()["ready_endpoints"] == 1, timeout_s=30)
    yield dep
    dep.stop()


def open_idle_body(port: int) -> socket.socket:
    """A connection from 127.0.0.2 that sends its headers and 1 of its 1,000 body bytes."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=("127.0.0.2", 0))
    head = (
        "POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        "content-length: 1000\r\n\r\n"
    )
    sock.sendall(head.encode() + b"{")
    return sock


def answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """The status, headers and body a connection got (0 when it was closed without one)."""
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                return 0, {}, data
            data += chunk
        head, body = data.split(b"\r\n\r\n", 1)
        lines = head.decode().split("\r\n")
        headers = dict(line.lower().split(": ", 1) for line in lines[1:])
        length = int(headers.get("content-length", "0"))
        while len(body) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
        return int(lines[0].split(" ")[1]), headers, body
    except (ConnectionResetError, TimeoutError):
        return 0, {}, data


def test_a_client_holding_idle_bodies_cannot_starve_another(gateway):
    port = urlsplit(gateway.url).port
    idle = [open_idle_body(port) for _ in range(IDLE)]
    try:
        results: list[tuple[int, dict[str, str], bytes]] = [(0, {}, b"")] * IDLE

        def collect(i: int) -> None:
            results[i] = answer(idle[i])

        readers = [threading.Thread(target=collect, args=(i,)) for i in range(IDLE)]
        for t in readers:
            t.start()
        # While the idle bodies are held (3 s), the other client is served, every time.
        served = []
        with httpx.Client(base_url=gateway.url, timeout=10) as other:
            started = time.monotonic()
            while time.monotonic() - started < 2.0:
                resp = other.post("/v1/completions", json={"model": MODEL, "prompt": "hello", "max_tokens": 2})
                served.append(resp.status_code)
        assert served and set(served) == {200}, served
        for t in readers:
            t.join(15)
        statuses = sorted(status for status, _, _ in results)
        # 4 bodies held until the deadline (408); the rest refused at once (429): over the client's
        # share of unfinished bodies, or (past 12) of connections.
        assert statuses == [408] * 4 + [429] * (IDLE - 4), statuses
        for status, headers, body in results:
            if status == 429:
                assert headers["retry-after"] == "1"
                error = json.loads(body)["error"]
                assert error["type"] == "rate_limit_error" and error["code"] == "rate_limit_exceeded", error
    finally:
        for sock in idle:
            sock.close()
    # Everything was given back: the client has its whole share of bodies again, and no more.
    again = [open_idle_body(port) for _ in range(5)]
    try:
        time.sleep(1.0)  # the refusal comes at once, the 408s only after 3 s
        answered, _, _ = select.select(again, [], [], 0)
        assert len(answered) == 1 and answer(answered[0])[0] == 429  # four wait, one refused
    finally:
        for sock in again:
            sock.close()
