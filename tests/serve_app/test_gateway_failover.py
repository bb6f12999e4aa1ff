"""The gateway's address survives a replica's death: two replicas share one port (SO_REUSEPORT);
killing one under load refuses no connection, fails at most the connections it held (in flight, or
queued on its socket: the kernel resets those unless `net.ipv4.tcp_migrate_req` is 1), the port
keeps answering, and Serve's replacement joins the port again."""

from __future__ import annotations

import errno
import itertools
import threading
import time

import httpx
import pytest

from tests.conftest import GATEWAY_TEST_PORT
from tests.serve_app.deployments import TWO_REPLICAS, replicas

pytestmark = pytest.mark.ray

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
WORKERS = 4


# The setup of test_decision_record.py and extproc/test_extproc_failover.py (tests/conftest.py
# orders them): the kill waits for Serve's replacement, so it runs among the tests that leave the
# setup whole; the stop runs after every other test of the setup, the ext_proc failover's included.
E2E_SETUP = TWO_REPLICAS


class Load:
    """WORKERS threads, each one request at a time on a fresh connection, bounded in time."""

    def __init__(self, url: str, duration_s: float) -> None:
        self.url = url
        self.deadline = time.monotonic() + duration_s
        self.lock = threading.Lock()
        self.ok: list[float] = []  # completion times
        self.refused: list[str] = []
        self.failed: list[str] = []
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(WORKERS)]

    def _run(self) -> None:
        body = {"model": MODEL, "prompt": "hello there", "max_tokens": 8}
        while time.monotonic() < self.deadline:
            try:
                with httpx.Client(timeout=30) as c:
                    resp = c.post(f"{self.url}/v1/completions", json=body)
                with self.lock:
                    if resp.status_code == 200:
                        self.ok.append(time.monotonic())
                    else:
                        self.failed.append(f"{resp.status_code} {resp.text[:80]}")
            except httpx.ConnectError as err:
                reset = isinstance(err.__context__, ConnectionResetError) or f"[Errno {errno.ECONNRESET}]" in str(err)
                with self.lock:  # a reset: the connection was queued on the dying socket
                    (self.failed if reset else self.refused).append(repr(err))
                time.sleep(0.05)
            except httpx.HTTPError as err:  # the connection broke mid-request
                with self.lock:
                    self.failed.append(repr(err))

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        for t in self.threads:
            t.join(60)


def test_killing_a_replica_under_load_keeps_the_address_up(gateway):
    import ray
    from ray import serve

    url = gateway.url
    assert url == f"http://127.0.0.1:{GATEWAY_TEST_PORT}"
    before = replicas(url, 2)
    assert len(before) == 2, f"both replicas serve the one port: saw {before}"
    victim = min(before)
    handle = ray.get_actor(victim, namespace="serve")

    with Load(url, duration_s=8.0) as load:
        time.sleep(2.0)
        killed_at = time.monotonic()
        ray.kill(handle, no_restart=True)
    after = [t for t in load.ok if t > killed_at + 0.5]
    assert load.refused == [], load.refused[:5]
    # at most the connections on the victim: each worker holds one at a time
    assert len(load.failed) <= WORKERS, load.failed
    assert len(after) > 20, f"the survivor kept serving: {len(after)} answers after the kill"
    gaps = [b - a for a, b in itertools.pairwise(sorted(load.ok)) if a > killed_at]
    assert max(gaps, default=0) < 1.0, f"the port answered throughout: longest gap {max(gaps):.2f} s"

    print(f"\nfailover: {len(load.ok)} answered, {len(load.failed)} failed, {len(load.refused)} refused")
    # Serve replaces the replica; the new one joins the port.
    deadline = time.monotonic() + 90
    fresh: dict[str, int] = {}
    while time.monotonic() < deadline and not fresh:
        status = serve.status().applications["epp"].deployments["Gateway"]
        if status.replica_states.get("RUNNING", 0) == 2:
            fresh = {r: pid for r, pid in replicas(url, 2, tries=100).items() if r not in before}
        time.sleep(0.5)
    assert fresh, "a new replica serves the port again"
    print(f"failover: the replacement serves the port {time.monotonic() - killed_at:.1f} s after the kill")
    now = replicas(url, 2)
    assert len(now) == 2 and victim not in now, now


@pytest.mark.spends_e2e_setup(2)
def test_stopping_the_gateway_lets_a_stream_in_flight_finish(gateway, ray_session):
    """A graceful stop (Ctrl-C, a downscale, `serve.delete`) leaves the port first and lets what
    is in flight finish: a stream begun before the stop ends whole, with [DONE]. Runs last of its
    setup: it stops the shared deployment."""
    import json

    body = {"model": MODEL, "prompt": "tell me a long story", "max_tokens": 400, "stream": True}
    chunks: list[str] = []
    started = threading.Event()
    ended: list[float] = []

    def stream() -> None:
        with httpx.Client(timeout=60) as c, c.stream("POST", f"{gateway.url}/v1/completions", json=body) as resp:
            assert resp.status_code == 200
            for line in resp.iter_lines():
                if line.startswith("data: "):
                    chunks.append(line[6:])
                    started.set()
        ended.append(time.monotonic())

    reader = threading.Thread(target=stream, daemon=True)
    reader.start()
    assert started.wait(30), "the stream began"
    t0 = time.monotonic()
    at_stop = len(chunks)
    gateway.stop()
    stopped = time.monotonic()
    reader.join(60)
    assert at_stop < len(chunks) / 2, f"the stop came mid-stream: {at_stop} of {len(chunks)} chunks"
    assert chunks and chunks[-1] == "[DONE]", chunks[-3:]
    tokens = sum(len(json.loads(c)["choices"][0].get("text", "")) > 0 for c in chunks[:-1])
    assert ended[0] - t0 > 1.0, "the stream outlived the stop's first second (the sim's 400 steps take ~2.8 s)"
    assert tokens >= 380, f"the whole stream arrived: {tokens} token chunks"
    print(
        f"\ngraceful stop at chunk {at_stop}/{len(chunks)}: the stream ended whole; stop took"
        f" {stopped - t0:.1f} s, the stream ended {ended[0] - t0:.1f} s after it began"
    )
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{gateway.url}/health", timeout=5)
