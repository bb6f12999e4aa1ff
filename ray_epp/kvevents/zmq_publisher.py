"""vLLM's ZMQ KV-event publisher protocol (vllm/distributed/kv_events.py, ZmqEventPublisher).

* A PUB socket sends each batch as three frames: the topic, the sequence number (8 bytes,
  big-endian, from 0 for each publisher), and the msgpack payload (`ray_epp.kvevents.wire`).
* A ROUTER socket serves replays: a client sends `[empty, start_seq (8 bytes)]` (a DEALER with an
  empty delimiter frame, or a REQ) and gets every buffered batch with seq >= start_seq as
  `[empty, seq, payload]`, then the end marker `[empty, seq -1 (8 bytes, signed), b""]`.
  The buffer is a ring of the last `buffer_steps` batches.

`publish` only queues the batch: one thread owns both sockets, encodes, sends and answers
replays, so the caller's loop (an engine step) pays a queue put. Endpoints bind; a port of `*` or 0
binds a free port, and `endpoint` / `replay_endpoint` then give the bound address.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections import deque

import zmq

from ray_epp.kvevents.events import KVEventBatch
from ray_epp.kvevents.wire import encode_batch

log = logging.getLogger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)


def _bind(sock: zmq.Socket, endpoint: str, retry_s: float = 1.0) -> str:
    """Bind; a port just released by a closed socket (ZMQ unbinds asynchronously) is retried briefly."""
    if endpoint.startswith("tcp://") and endpoint.endswith(":0"):
        endpoint = endpoint[:-2] + ":*"
    deadline = time.monotonic() + retry_s
    while True:
        try:
            sock.bind(endpoint)
            return sock.getsockopt_string(zmq.LAST_ENDPOINT)
        except zmq.ZMQError as e:
            if e.errno != zmq.EADDRINUSE or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


class ZmqEventPublisher:
    """Publishes `KVEventBatch`es as a vLLM engine does, with a replay ring."""

    def __init__(
        self,
        endpoint: str = "tcp://127.0.0.1:0",
        replay_endpoint: str | None = "tcp://127.0.0.1:0",
        *,
        topic: str = "",
        buffer_steps: int = 10_000,
        hwm: int = 100_000,
        max_queue_size: int = 100_000,
        data_parallel_rank: int = 0,
    ) -> None:
        self._ctx = zmq.Context.instance()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.set_hwm(hwm)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._replay: zmq.Socket | None = None
        try:
            self.endpoint = _bind(self._pub, endpoint)
            self.replay_endpoint: str | None = None
            if replay_endpoint is not None:
                self._replay = self._ctx.socket(zmq.ROUTER)
                self._replay.setsockopt(zmq.LINGER, 0)
                self.replay_endpoint = _bind(self._replay, replay_endpoint)
        except zmq.ZMQError as e:
            self._close_sockets()
            raise OSError(f"cannot bind KV-event publisher on {endpoint} / {replay_endpoint}: {e}") from None
        self._topic = topic.encode()
        self._rank = data_parallel_rank
        self._queue: queue.Queue[KVEventBatch | None] = queue.Queue(maxsize=max_queue_size)
        self._ring: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._seq = 0
        self._skip_live = 0
        self._lock = threading.Lock()
        self.published = 0
        self.dropped = 0  # batches refused because the queue was full
        self.replays = 0
        self._running = True
        self._thread = threading.Thread(target=self._run, name="kv-event-publisher", daemon=True)
        self._thread.start()

    def publish(self, batch: KVEventBatch) -> None:
        """Queue a batch for sending (never blocks; a full queue drops it and counts it)."""
        if not self._running:
            raise RuntimeError("publisher is closed")
        if batch.data_parallel_rank is None:
            batch.data_parallel_rank = self._rank
        try:
            self._queue.put_nowait(batch)
        except queue.Full:
            self.dropped += 1

    def skip_live(self, n: int = 1) -> None:
        """Fault injection for failure tests: the next `n` batches go to the replay ring only."""
        with self._lock:
            self._skip_live += n

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every queued batch was sent; False if that took longer than `timeout`."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.002)
        return True

    @property
    def next_seq(self) -> int:
        return self._seq

    def close(self, timeout: float = 1.0) -> None:
        """Send what is queued (up to `timeout`), stop the thread and close the sockets."""
        if not self._running:
            return
        self._running = False
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=timeout)
        self._thread.join(timeout)
        self._close_sockets()

    def _close_sockets(self) -> None:
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)

    def __enter__(self) -> ZmqEventPublisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self) -> None:
        replay = self._replay
        poller = zmq.Poller()
        if replay is not None:
            poller.register(replay, zmq.POLLIN)
        while True:
            if replay is not None and poller.poll(0):
                try:
                    self._serve_replay()
                except zmq.ZMQError as e:
                    log.warning("KV-event replay failed: %s", e)
            try:
                batch = self._queue.get(timeout=0.02)
            except queue.Empty:
                if not self._running:
                    return
                continue
            try:
                if batch is None:
                    return
                self._send(batch)
            except Exception:
                log.exception("KV-event publisher could not send a batch")
            finally:
                self._queue.task_done()

    def _send(self, batch: KVEventBatch) -> None:
        payload = encode_batch(batch)
        seq = self._seq
        self._seq += 1
        self._ring.append((seq, payload))
        with self._lock:
            skip = self._skip_live > 0
            if skip:
                self._skip_live -= 1
        if not skip:
            self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload), copy=False)
        self.published += 1

    def _serve_replay(self) -> None:
        assert self._replay is not None
        frames = self._replay.recv_multipart()
        if len(frames) != 3 or len(frames[2]) != 8:
            log.warning("invalid KV-event replay request (%d frames)", len(frames))
            return
        ident, _, start = frames
        start_seq = int.from_bytes(start, "big")
        self.replays += 1
        for seq, payload in list(self._ring):
            if seq >= start_seq:
                self._replay.send_multipart((ident, b"", seq.to_bytes(8, "big"), payload))
        self._replay.send_multipart((ident, b"", END_SEQ, b""))
