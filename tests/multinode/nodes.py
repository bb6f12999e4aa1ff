"""What the multi-node test modules share: nodes of a `ray.cluster_utils.Cluster` on this machine
with fixed ports, where an actor runs, and a steady load of requests that records every outcome."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx

from bench import local_cluster
from tests.conftest import GATEWAY_TEST_PORT

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def complete(client: httpx.Client, port: int, prompt: str = "hello there") -> httpx.Response:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 4}
    return client.post(f"http://127.0.0.1:{port}/v1/completions", json=body)


class Traffic:
    """4 threads, one request at a time each, every request with a 30 s timeout, until stopped
    (or 150 s): (monotonic time sent, monotonic time answered, outcome) for each, outcome "ok" or why
    it failed."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.results: list[tuple[float, float, str]] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.deadline = time.monotonic() + 150
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(4)]
        for t in self.threads:
            t.start()

    def _run(self, worker: int) -> None:
        n = 0
        while not self.stop.is_set() and time.monotonic() < self.deadline:
            n += 1
            sent = time.monotonic()
            try:
                with httpx.Client(timeout=30) as client:  # a fresh connection: the kernel picks a replica
                    resp = complete(client, self.port, f"worker {worker} request {n}")
                outcome = "ok" if resp.status_code == 200 else f"{resp.status_code} {error_message(resp)}"
            except httpx.ConnectError:
                outcome = "connect refused"
            except httpx.TimeoutException:
                outcome = "timed out (30 s)"
            except httpx.HTTPError as err:
                outcome = f"connection broke: {type(err).__name__}"
            with self.lock:
                self.results.append((sent, time.monotonic(), outcome))
            time.sleep(0.02)

    def finish(self) -> list[tuple[float, float, str]]:
        self.stop.set()
        for t in self.threads:
            t.join(40)
        assert not any(t.is_alive() for t in self.threads), "a request hung"
        return sorted(self.results)


def error_message(resp: httpx.Response) -> str:
    try:
        return resp.json()["error"]["message"][:100]
    except Exception:
        return resp.text[:100]


def start_cluster(workers: dict[str, dict[str, str]], head_cpus: int, worker_cpus: int) -> Iterator[tuple]:
    """For a module fixture to yield from: a head (label epp/host=head) and the named workers with
    their labels, on this checkout's ports, this driver attached; yields (cluster, node id by
    name, node by name). tests/conftest.py runs these modules last: a driver attaches to one
    cluster at a time."""
    for c, ids, nodes, _ in local_cluster.start_cluster(
        workers, head_cpus, worker_cpus, base=GATEWAY_TEST_PORT + 400, namespace="ray-epp-multinode"
    ):
        yield c, ids, nodes
