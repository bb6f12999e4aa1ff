"""One client floods a gateway replica's door with idle connections; are the others still served?

The flooding client (source address 127.0.0.2) opens `--connections` connections that each send
their headers and 1 of 1,000 declared body bytes, then nothing. Meanwhile another client
(127.0.0.1) sends `--probes` ordinary completions one after another. Twice, on fresh deployments
with `epp up`'s defaults (one replica, 1,536 in flight, 30 s body deadline) in front of two
simulated pods: once with the per-client limits out of reach (as before they existed), once with
their defaults.

    .venv/bin/python -m bench.door_flood --connections 2100 --port 18620
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import socket
import sys
import time
from collections import Counter
from typing import Any

import httpx

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
NO_CLIENT_LIMITS = {
    "client_max_in_flight": 10**6,
    "client_max_unfinished_bodies": 10**6,
    "client_max_connections": 10**6,
}
HEAD = (
    b"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
    b"content-length: 1000\r\n\r\n{"
)


def flood(port: int, n: int) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=("127.0.0.2", 0))
        sock.sendall(HEAD)
        socks.append(sock)
    return socks


class Answers:
    """The status each flooding connection got so far ('waiting' for none yet)."""

    def __init__(self, socks: list[socket.socket]) -> None:
        self.socks = socks
        self.got: dict[socket.socket, str] = {}
        self.sel = selectors.DefaultSelector()  # epoll: past select()'s 1,024 descriptors
        for sock in socks:
            self.sel.register(sock, selectors.EVENT_READ)

    def collect(self, seconds: float) -> int:
        """Read what arrives within `seconds`; how many new answers came."""
        new = 0
        deadline = time.monotonic() + seconds
        while len(self.got) < len(self.socks) and (left := deadline - time.monotonic()) > 0:
            for key, _ in self.sel.select(min(0.5, left)):
                sock = key.fileobj
                try:
                    data = sock.recv(64)
                    self.got[sock] = data.split(b" ")[1].decode() if data else "closed"
                except OSError as err:
                    self.got[sock] = type(err).__name__
                self.sel.unregister(sock)
                new += 1
        return new

    def settle(self, quiet_s: float = 3.0, limit_s: float = 120.0) -> None:
        """Until no new answer came for `quiet_s`: the replica has read every flooding request."""
        deadline = time.monotonic() + limit_s
        while not self.got and time.monotonic() < deadline:  # the refusals come once the rest is in
            self.collect(1.0)
        while self.collect(quiet_s) and time.monotonic() < deadline:
            pass

    def counts(self) -> dict[str, int]:
        return dict(Counter(self.got.get(s, "waiting") for s in self.socks))


def in_flight(client: httpx.Client) -> float | None:
    """The replica's requests in flight, from its /metrics."""
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("ray_epp_gateway_in_flight_requests"):
            return float(line.rsplit(" ", 1)[1])
    return None


def run_one(label: str, settings: dict[str, Any], port: int, connections: int, probes: int) -> dict[str, Any]:
    from actors.launcher import PodSpec
    from ray_epp.simulator import make_pod_configs, start_sim_pods_in_thread
    from serve_app.cli.launch import EppDeployment, LaunchSpec

    cluster = start_sim_pods_in_thread(make_pod_configs(2), time_scale=1.0, seed=3)
    pods = [PodSpec(name=p.name, address="127.0.0.1", port=p.port, labels=p.labels) for p in cluster.pods]
    dep = EppDeployment.start(LaunchSpec(pods=pods, port=port, settings=settings))
    try:
        with httpx.Client(base_url=dep.url, timeout=60) as other:
            deadline = time.monotonic() + 60
            while other.get("/ready").status_code != 200 and time.monotonic() < deadline:
                time.sleep(0.5)
            started = time.monotonic()
            socks = flood(port, connections)
            opened_s = time.monotonic() - started
            answers = Answers(socks)
            answers.settle()  # every flooding request read and counted, or refused
            gauge = in_flight(other)
            results = []
            for _ in range(probes):
                t = time.monotonic()
                resp = other.post("/v1/completions", json={"model": MODEL, "prompt": "hello", "max_tokens": 4})
                results.append({"status": resp.status_code, "s": round(time.monotonic() - t, 3),
                                "error": resp.text[:120] if resp.status_code != 200 else ""})  # fmt: skip
            answers.collect(0.5)
            flooded = answers.counts()
            settled_s = time.monotonic() - started
            for sock in socks:
                sock.close()
    finally:
        dep.stop()
        cluster.stop()
    return {"label": label, "settings": settings, "connections": connections, "opened_s": round(opened_s, 2),
            "probed_after_s": round(settled_s, 1), "in_flight_at_probe": gauge, "flood_answers": flooded,
            "probes": results}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench.door_flood", description=__doc__.split("\n")[0])
    p.add_argument("--connections", type=int, default=2100)
    p.add_argument("--probes", type=int, default=5)
    p.add_argument("--port", type=int, default=int(os.environ.get("EPP_TEST_PORT", "18620")))
    p.add_argument("--json", default="")
    a = p.parse_args(argv)
    print(f"load average {os.getloadavg()}", flush=True)
    rows = [
        run_one("per-client limits out of reach", NO_CLIENT_LIMITS, a.port, a.connections, a.probes),
        run_one("per-client limits (defaults)", {}, a.port, a.connections, a.probes),
    ]
    for r in rows:
        ok = sum(1 for x in r["probes"] if x["status"] == 200)
        errors = [x["error"] for x in r["probes"] if x["error"]][:1]
        print(f"{r['label']}: other client {ok}/{len(r['probes'])} ok {[x['status'] for x in r['probes']]}; "
              f"in flight {r['in_flight_at_probe']}; flooding client's answers: {r['flood_answers']} "
              f"({r['probed_after_s']} s after the flood began); errors: {errors}")  # fmt: skip
    print(f"load average {os.getloadavg()}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"load_average_end": os.getloadavg(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
