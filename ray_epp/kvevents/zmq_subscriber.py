"""A subscriber to one engine's KV events: vLLM's SUB + replay protocol, in order, gaps repaired.

Per pod: a SUB socket on the engine's publisher and a DEALER on its replay ROUTER
(`ray_epp.kvevents.zmq_publisher` describes the frames). Every batch is handed to `on_batch(pod, batch)`
in sequence order, each exactly once:

* a sequence gap (a message the SUB socket lost) is asked for again through the replay socket;
  what the engine's ring no longer holds is counted `lost` and the pod is `gapped` until its next
  `AllBlocksCleared`, after which its picture is complete again;
* a subscriber that joins a publisher already past seq 0 replays from 0 first (`replay_on_join`),
  so an engine that cached blocks before the router came up is not missed (ZMQ's late joiner).
  It asks as soon as its SUB socket connects, not when the next batch shows the gap: a PUB drops
  what it sends before the subscription reaches it (ZMQ's slow joiner), and an engine that then
  goes idle would otherwise stay unknown until it publishes again. Batches that then also arrive
  on the SUB socket are recognised by sequence and payload and counted as duplicates;
* a restarted engine starts its sequence at 0 again, and its cache is empty. When the SUB socket
  reconnects, the subscriber asks the replay socket for its last seq: the same payload means the
  same stream (a network blip: carry on, gaps repaired); another payload, or none, means a new
  engine. Then an `AllBlocksCleared` batch is handed on first (`resets`), and the new stream
  from its seq 0. Without a replay socket, a sequence that goes backwards counts as a restart;
* frames that are not `[topic, 8-byte seq, payload]` or a payload that is not a batch are counted
  `garbage` and skipped; a callback that raises is counted and logged; nothing stops the loop.

Threaded, not asyncio: the consumers are Ray actors with their own event loops and plain
synchronous code (the in-process scheduler, tests), and pyzmq's blocking poll in a thread keeps
decoding off every loop; one thread per pod, each stopping within one poll interval (50 ms).
`on_batch` runs in that thread: a consumer on an event loop hands it over with
`loop.call_soon_threadsafe`.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import zmq
from zmq.utils.monitor import recv_monitor_message

from ray_epp.kvevents.events import AllBlocksCleared, KVEventBatch
from ray_epp.kvevents.wire import WireError, decode_batch

log = logging.getLogger(__name__)

_POLL_MS = 50
_LAST_SEQ = 2**63 - 1  # "to the end of the ring" in a replay request


class SubscriberState(enum.StrEnum):
    CONNECTING = "connecting"  # nothing received yet
    LIVE = "live"
    GAPPED = "gapped"  # some batches were lost: the pod's picture is incomplete
    SILENT = "silent"  # nothing for `silent_after_s` (an idle engine publishes nothing, too)
    STOPPED = "stopped"


@dataclass(slots=True)
class SubscriberStatus:
    pod: str
    state: SubscriberState
    last_seq: int | None
    batches: int  # delivered to the callback
    replayed: int  # of those, recovered through the replay socket
    gaps: int  # gaps seen
    lost: int  # batches a replay could not recover
    resets: int  # engine restarts seen (sequence went backwards)
    garbage: int  # malformed messages skipped
    duplicates: int
    callback_errors: int
    silent_for_s: float


OnBatch = Callable[[str, KVEventBatch], None]


class ZmqEventSubscriber:
    """Follows one pod's KV-event stream; `start()`, `status()`, `stop()`."""

    def __init__(
        self,
        pod: str,
        endpoint: str,
        on_batch: OnBatch,
        replay_endpoint: str | None = None,
        *,
        topic: str = "",
        silent_after_s: float = 10.0,
        replay_timeout_s: float = 1.0,
        replay_on_join: bool = True,
    ) -> None:
        self.pod = pod
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self._on_batch = on_batch
        self._topic = topic.encode()
        self._silent_after_s = silent_after_s
        self._replay_timeout_s = replay_timeout_s
        self._replay_on_join = replay_on_join
        self._ctx = zmq.Context.instance()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.setsockopt(zmq.SUBSCRIBE, self._topic)
        self._dealer: zmq.Socket | None = None
        # connections are watched only to tell a restarted engine from the one we follow (replay)
        self._monitor: zmq.Socket | None = None
        if replay_endpoint is not None:
            self._monitor = self._sub.get_monitor_socket(zmq.EVENT_CONNECTED)
        self._connects = 0
        try:
            self._sub.connect(endpoint)
        except zmq.ZMQError as e:
            self._close()
            raise ValueError(f"pod {pod}: bad KV-event endpoint {endpoint!r}: {e}") from None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_seq: int | None = None
        self._last_payload: bytes | None = None
        self._joined: dict[int, bytes] | None = None  # the join's replay, until the SUB socket passes it
        self._gapped = False
        self._started_at = time.monotonic()
        self._last_msg_at: float | None = None
        self.batches = self.replayed = self.gaps = self.lost = self.resets = 0
        self.garbage = self.duplicates = self.callback_errors = 0

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> ZmqEventSubscriber:
        if self._thread is not None:
            raise RuntimeError("subscriber already started")
        self._started_at = time.monotonic()
        self._thread = threading.Thread(target=self._run, name=f"kv-events:{self.pod}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 2.0) -> None:
        """Stop the thread (within one poll interval) and close the sockets."""
        self._stop.set()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(timeout)
        if self._thread is None or not self._thread.is_alive():
            self._close()

    def __enter__(self) -> ZmqEventSubscriber:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def status(self) -> SubscriberStatus:
        now = time.monotonic()
        silent_for = now - (self._last_msg_at if self._last_msg_at is not None else self._started_at)
        if self._stop.is_set():
            state = SubscriberState.STOPPED
        elif self._gapped:
            state = SubscriberState.GAPPED
        elif silent_for >= self._silent_after_s:
            state = SubscriberState.SILENT
        elif self._last_msg_at is None:
            state = SubscriberState.CONNECTING
        else:
            state = SubscriberState.LIVE
        return SubscriberStatus(
            pod=self.pod, state=state, last_seq=self._last_seq, batches=self.batches, replayed=self.replayed,
            gaps=self.gaps, lost=self.lost, resets=self.resets, garbage=self.garbage, duplicates=self.duplicates,
            callback_errors=self.callback_errors, silent_for_s=silent_for,
        )

    # -- the loop --------------------------------------------------------------------------------

    def _run(self) -> None:
        sub = self._sub
        poller = zmq.Poller()
        poller.register(sub, zmq.POLLIN)
        if self._monitor is not None:
            poller.register(self._monitor, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                ready = dict(poller.poll(_POLL_MS))
                if self._monitor is not None and self._monitor in ready:
                    self._on_monitor()
                if sub not in ready:
                    continue
                while not self._stop.is_set():
                    try:
                        frames = sub.recv_multipart(zmq.NOBLOCK, copy=True)
                    except zmq.Again:
                        break
                    self._on_message(frames)
        except zmq.ZMQError as e:
            if not self._stop.is_set():
                log.error("pod %s: KV-event subscriber stopped on a socket error: %s", self.pod, e)
        finally:
            self._close()

    def _close(self) -> None:
        if self._monitor is not None:
            self._sub.disable_monitor()
            self._monitor.close(linger=0)
            self._monitor = None
        self._sub.close(linger=0)
        if self._dealer is not None:
            self._dealer.close(linger=0)
            self._dealer = None

    def _on_monitor(self) -> None:
        assert self._monitor is not None
        while True:
            try:
                recv_monitor_message(self._monitor, zmq.NOBLOCK)
            except zmq.Again:
                break
            self._connects += 1
            if self._last_seq is None:
                if self._replay_on_join:
                    self._join()
            elif self._connects > 1:
                self._check_stream()

    def _join(self) -> None:
        """Connected with nothing received yet: deliver all the replay ring holds, from seq 0."""
        got = self._replay(0, _LAST_SEQ)
        if not got:
            return  # nothing published yet (or no replay answer): the SUB socket's first batch decides
        self._last_msg_at = time.monotonic()  # heard from: live (or gapped), no longer connecting
        self._catch_up(0, max(got), got)
        self._joined = got

    def _check_stream(self) -> None:
        """After a reconnect: is the publisher the engine we followed, or a restarted one?"""
        last = self._last_seq
        assert last is not None
        got = self._replay(last, last)
        if got.get(last) == self._last_payload:
            return
        self.resets += 1
        log.info("pod %s: the KV-event publisher is a new stream after reconnecting: engine restarted", self.pod)
        self._deliver(None, KVEventBatch(ts=time.time(), events=[AllBlocksCleared()]), replayed=False)
        self._last_seq = self._last_payload = None
        self._gapped = False

    def _on_message(self, frames: list[bytes]) -> None:
        self._last_msg_at = time.monotonic()
        if len(frames) != 3 or len(frames[1]) != 8:
            self._garbage(f"{len(frames)} frames")
            return
        seq = int.from_bytes(frames[1], "big")
        try:
            batch = decode_batch(frames[2])
        except WireError as e:
            self._garbage(str(e))
            return
        last = self._last_seq
        joined = self._joined
        if joined is not None and last is not None:
            if seq <= last and joined.get(seq) == frames[2]:
                self.duplicates += 1  # already delivered by the join's replay
                return
            self._joined = None
        if last is None:
            if seq > 0 and self._replay_on_join:
                self._catch_up(0, seq - 1)
        elif seq == last:
            self.duplicates += 1
            return
        elif seq < last:
            self.resets += 1
            log.info("pod %s: KV-event sequence went back (%d -> %d): engine restarted", self.pod, last, seq)
            self._deliver(None, KVEventBatch(ts=batch.ts, events=[AllBlocksCleared()]), replayed=False)
            self._gapped = False
            if seq > 0:
                self._catch_up(0, seq - 1)
        elif seq > last + 1:
            self.gaps += 1
            self._catch_up(last + 1, seq - 1)
        self._deliver(seq, batch, replayed=False)
        self._last_payload = frames[2]

    def _garbage(self, why: str) -> None:
        self.garbage += 1
        if self.garbage <= 3 or self.garbage % 1000 == 0:
            log.warning("pod %s: skipped a malformed KV-event message (%d so far): %s", self.pod, self.garbage, why)

    def _deliver(self, seq: int | None, batch: KVEventBatch, *, replayed: bool) -> None:
        if seq is not None:
            self._last_seq = seq
        if any(isinstance(e, AllBlocksCleared) for e in batch.events):
            self._gapped = False
        self.batches += 1
        self.replayed += replayed
        try:
            self._on_batch(self.pod, batch)
        except Exception:
            self.callback_errors += 1
            log.exception("pod %s: KV-event callback failed", self.pod)

    # -- replay ----------------------------------------------------------------------------------

    def _catch_up(self, first: int, last: int, got: dict[int, bytes] | None = None) -> None:
        """Deliver seqs first..last from the replay socket (or its answer `got`); what it cannot
        give is lost."""
        if got is None:
            got = self._replay(first, last)
        missing = 0
        for seq in range(first, last + 1):
            payload = got.get(seq)
            if payload is None:
                missing += 1
                continue
            try:
                batch = decode_batch(payload)
            except WireError as e:
                self._garbage(f"replayed seq {seq}: {e}")
                missing += 1
                continue
            self._deliver(seq, batch, replayed=True)
            self._last_payload = payload
        if missing:
            self.lost += missing
            self._gapped = True
            log.warning("pod %s: %d KV-event batches (seq %d..%d) could not be replayed", self.pod, missing,
                        first, last)

    def _replay(self, first: int, last: int) -> dict[int, bytes]:
        if self.replay_endpoint is None:
            return {}
        if self._dealer is None:
            self._dealer = self._ctx.socket(zmq.DEALER)
            self._dealer.setsockopt(zmq.LINGER, 0)
            self._dealer.connect(self.replay_endpoint)
        dealer = self._dealer
        out: dict[int, bytes] = {}
        dealer.send_multipart((b"", first.to_bytes(8, "big")))
        deadline = time.monotonic() + self._replay_timeout_s
        while True:
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0 or not dealer.poll(remaining_ms):
                # no end marker in time: a later answer to this request must not be read as the next one's
                dealer.close(linger=0)
                self._dealer = None
                log.warning("pod %s: KV-event replay from seq %d timed out", self.pod, first)
                return out
            frames = dealer.recv_multipart()
            if len(frames) != 3 or len(frames[1]) != 8:
                self._garbage(f"replay answer of {len(frames)} frames")
                continue
            seq = int.from_bytes(frames[1], "big", signed=True)
            if seq == -1:
                return out
            if first <= seq <= last:
                out[seq] = frames[2]
