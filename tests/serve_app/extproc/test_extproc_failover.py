"""Two gateway replicas behind one ext_proc port (SO_REUSEPORT, serve_app/extproc/server.py), one
killed under ext_proc load: no stream is lost that had not started, on Ray EPP's side.

What Envoy is configured to do, and what the client here does: Envoy's ext_proc filter opens its
gRPC stream with `setBufferBodyForRetry` when its `GrpcService` has a `retry_policy`
(deploy/envoy.yaml: `retry_on: connect-failure,refused-stream,reset,unavailable`, 3 retries). Its
gRPC client then keeps what it sent on the stream and, when the stream fails before the ext_proc
server answered anything (no response headers yet: a gRPC server sends them with its first
message), may replay it on a new connection, which the kernel gives to a live replica. A stream
that had an answer is not retried: with `failure_mode_allow: false` Envoy fails that request (500,
or a reset once the response began). The client below replays every stream that failed with
UNAVAILABLE before its first answer (at most 3 times, on a new connection), and counts one that
failed after as lost in flight (the policy is read from deploy/envoy.yaml). A real Envoy replays
only some such streams (test_real_envoy.py, docs/EXT_PROC.md "When a replica dies"): this test
checks that every replay is answered by the survivor. Real Ray, real Serve, two replicas,
simulated pods."""

from __future__ import annotations

import json
import threading
import time

import grpc
import psutil
import pytest
import yaml

from bench.real_envoy import BOOTSTRAP
from tests.serve_app.deployments import TWO_REPLICAS, replicas, wait_until
from tests.serve_app.extproc.envoy import Stream, decide, respond

pytestmark = [pytest.mark.ray, pytest.mark.spends_e2e_setup(1)]

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
EXT_PROC_PORT = TWO_REPLICAS.spec["ext_proc_port"]
WORKERS = 6
MAX_LOAD_S = 120.0  # the load's bound in time; it stops sooner, once the survivor has shown it serves
AFTER_KILL = 20  # streams the survivor answers after the kill before the load stops
# Each client uploads its body slowly (the last chunk after this pause): most of the time each
# stream is under way without an answer yet, the streams a dead replica's death must not lose.
UPLOAD_PAUSE_S = 1.0


def envoy_retry_policy() -> dict:
    """The ext_proc filter's gRPC retry policy in deploy/envoy.yaml: what the client mirrors."""
    config = yaml.safe_load(BOOTSTRAP.read_text())
    hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    ext_proc = next(f for f in hcm["http_filters"] if f["name"] == "envoy.filters.http.ext_proc")
    return ext_proc["typed_config"]["grpc_service"]["retry_policy"]


POLICY = envoy_retry_policy()
RETRIES = int(POLICY["num_retries"])
BACKOFF_S = float(POLICY["retry_back_off"]["base_interval"].removesuffix("s"))


# The setup of test_decision_record.py and test_gateway_failover.py (tests/conftest.py orders
# them): it kills a replica, so it runs after the tests that need the setup whole, and before the
# gateway failover's stop, which needs one replica alive.
E2E_SETUP = TWO_REPLICAS


def new_stub(address: str):
    """A channel of its own (its own connection, as a new Envoy connection is)."""
    from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

    channel = grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])
    return channel, pb_grpc.ExternalProcessorStub(channel)


def ext_proc_sockets(pid: int) -> tuple[bool, int]:
    """Whether the process listens on the ext_proc port, and how many connections it holds there."""
    conns = [c for c in psutil.Process(pid).net_connections(kind="tcp") if c.laddr and c.laddr.port == EXT_PROC_PORT]
    listening = any(c.status == psutil.CONN_LISTEN for c in conns)
    return listening, sum(c.status == psutil.CONN_ESTABLISHED for c in conns)


class Load:
    """WORKERS threads, one request at a time each through the picker as Envoy carries it (request
    phase with a slow upload, the pod, response phase), with Envoy's retry of a stream that had no
    answer yet; until told to stop (bounded by MAX_LOAD_S)."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.deadline = time.monotonic() + MAX_LOAD_S
        self.stopped = threading.Event()
        self.lock = threading.Lock()
        self.ok: list[float] = []  # completion times
        self.replayed = 0  # streams that failed before an answer and were answered on a replay
        self.lost_in_flight: list[str] = []  # failed after the picker had answered
        self.lost_not_started: list[str] = []  # failed before any answer, replays exhausted
        self.threads = [threading.Thread(target=self._run, args=(w,), daemon=True) for w in range(WORKERS)]

    def _run(self, worker: int) -> None:
        channel, stub = new_stub(self.address)
        i = 0
        try:
            while time.monotonic() < self.deadline and not self.stopped.is_set():
                i += 1
                body = json.dumps({"model": MODEL, "prompt": f"worker {worker} request {i}", "max_tokens": 6})
                for attempt in range(RETRIES + 1):
                    outcome = self._one(stub, body.encode())
                    if outcome != "replay":
                        break
                    channel.close()  # Envoy's pool drops the dead connection; the replay opens a new one
                    channel, stub = new_stub(self.address)
                    time.sleep(BACKOFF_S * 2**attempt)
                with self.lock:
                    if outcome == "ok":
                        self.ok.append(time.monotonic())
                        self.replayed += attempt > 0
                    elif outcome == "replay":
                        self.lost_not_started.append(f"worker {worker} request {i}: {RETRIES} replays failed")
        finally:
            channel.close()

    def _one(self, stub, body: bytes) -> str:
        stream = Stream(stub, timeout_s=30)
        try:
            out = decide(stream, "/v1/completions", body, pause_s=UPLOAD_PAUSE_S)
            if out.immediate_status is not None:
                with self.lock:
                    self.lost_in_flight.append(f"answered {out.immediate_status}: {out.immediate_body[:80]!r}")
                return "lost"
            respond(stream, out, "/v1/completions")
            stream.half_close()
            stream.rest()
            return "ok" if out.status == 200 else "lost"
        except grpc.RpcError as err:
            if stream.received == 0 and err.code() == grpc.StatusCode.UNAVAILABLE:
                return "replay"
            with self.lock:
                where = "lost_in_flight" if stream.received else "lost_not_started"
                getattr(self, where).append(f"{err.code().name}: {err.details()}")
            return "lost"
        finally:
            stream.cancel()

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def answered_since(self, t: float) -> int:
        with self.lock:
            return sum(done > t for done in self.ok)

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        for t in self.threads:
            t.join(60)


def test_the_client_retries_as_deploy_envoy_yaml_tells_envoy_to():
    assert {"reset", "unavailable", "connect-failure"} <= set(POLICY["retry_on"].split(","))
    assert RETRIES >= 1 and BACKOFF_S > 0


def test_killing_a_replica_under_ext_proc_load_loses_no_stream_that_had_not_started(gateway):
    import ray

    pids = replicas(gateway.url, 2)  # actor name -> pid, over the shared HTTP port
    assert len(pids) == 2, f"two replicas: saw {pids}"
    wait_until(lambda: all(ext_proc_sockets(pid)[0] for pid in pids.values()), timeout_s=20)  # both listen

    with Load(gateway.ext_proc_address) as load:
        # the victim: the replica holding the most of the load's connections (all of them, at worst)
        def connections() -> dict[str, int] | None:
            held = {name: ext_proc_sockets(pid)[1] for name, pid in pids.items()}
            return held if sum(held.values()) >= WORKERS else None

        wait_until(lambda: load.answered_since(0) >= 2 * WORKERS, timeout_s=60)  # under way
        held = wait_until(connections, timeout_s=10, every_s=0.05)
        victim = max(held, key=held.get)
        killed_at = time.monotonic()
        ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)
        wait_until(lambda: load.answered_since(killed_at) >= AFTER_KILL, timeout_s=MAX_LOAD_S / 2)
    print(
        f"\next_proc failover: {len(load.ok)} answered ({load.replayed} after a replay), "
        f"{len(load.lost_in_flight)} lost in flight, {len(load.lost_not_started)} lost before they started; "
        f"the victim held {held[victim]} of {sum(held.values())} connections"
    )
    assert held[victim] >= 1
    assert load.lost_not_started == [], load.lost_not_started[:5]
    assert load.replayed >= 1, "the kill caught streams that had not started (they were replayed)"
    assert len(load.lost_in_flight) <= WORKERS, load.lost_in_flight  # each worker has one stream at a time
    assert load.answered_since(killed_at) >= AFTER_KILL  # the survivor answers the port's streams
