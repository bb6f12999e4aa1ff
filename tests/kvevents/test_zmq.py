"""Publisher and subscriber over real ZMQ sockets on 127.0.0.1 (free ports)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
import zmq

from ray_epp.kvevents import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    SubscriberState,
    ZmqEventPublisher,
    ZmqEventSubscriber,
    encode_batch,
)


class Sink:
    """Collects (pod, batch) from the subscriber thread."""

    def __init__(self) -> None:
        self.got: list[tuple[str, KVEventBatch]] = []
        self.cond = threading.Condition()

    def __call__(self, pod: str, batch: KVEventBatch) -> None:
        with self.cond:
            self.got.append((pod, batch))
            self.cond.notify_all()

    def wait_for(self, pred: Callable[[list[tuple[str, KVEventBatch]]], bool], timeout: float = 5.0) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: pred(self.got), timeout), f"timed out; got {len(self.got)} batches"

    def stored(self) -> list[int]:
        return [h for _, b in self.got for e in b.events if isinstance(e, BlockStored) for h in e.block_hashes]


def stored(i: int) -> KVEventBatch:
    return KVEventBatch(ts=float(i), events=[BlockStored([i], None, list(range(4)), 4)])


def connected(pub: ZmqEventPublisher, sub: ZmqEventSubscriber, sink: Sink) -> None:
    """Publish until the subscriber sees one: ZMQ's SUB joins asynchronously."""
    deadline = time.monotonic() + 5
    while not sink.got:
        assert time.monotonic() < deadline, "subscriber never connected"
        pub.publish(KVEventBatch(ts=0.0, events=[]))
        time.sleep(0.02)


@pytest.fixture
def pub():
    p = ZmqEventPublisher()
    yield p
    p.close()


def test_events_arrive_in_order_with_the_pod_name(pub: ZmqEventPublisher) -> None:
    sink = Sink()
    with ZmqEventSubscriber("pod-a", pub.endpoint, sink, pub.replay_endpoint) as sub:
        connected(pub, sub, sink)
        for i in range(1, 201):
            pub.publish(stored(i))
        sink.wait_for(lambda got: len(sink.stored()) == 200)
        assert sink.stored() == list(range(1, 201))
        assert {pod for pod, _ in sink.got} == {"pod-a"}
        st = sub.status()
        assert st.state is SubscriberState.LIVE and st.gaps == 0 and st.lost == 0 and st.garbage == 0
        assert st.last_seq == pub.next_seq - 1


def test_a_late_joiner_replays_from_the_start(pub: ZmqEventPublisher) -> None:
    for i in range(1, 6):
        pub.publish(stored(i))
    assert pub.flush()
    sink = Sink()
    with ZmqEventSubscriber("pod-a", pub.endpoint, sink, pub.replay_endpoint) as sub:
        pub.publish(stored(6))
        connected(pub, sub, sink)
        sink.wait_for(lambda got: 6 in sink.stored())
        assert sink.stored()[:6] == [1, 2, 3, 4, 5, 6]
        assert sub.status().replayed >= 5


def test_a_dropped_message_is_recovered_through_replay(pub: ZmqEventPublisher) -> None:
    sink = Sink()
    with ZmqEventSubscriber("pod-a", pub.endpoint, sink, pub.replay_endpoint) as sub:
        connected(pub, sub, sink)
        before = sub.status()
        pub.publish(stored(1))
        pub.skip_live(2)  # seqs of batches 2 and 3 go to the replay ring only
        pub.publish(stored(2))
        pub.publish(stored(3))
        pub.publish(stored(4))
        sink.wait_for(lambda got: 4 in sink.stored())
        assert sink.stored() == [1, 2, 3, 4]
        st = sub.status()
        assert st.gaps - before.gaps == 1 and st.replayed - before.replayed == 2
        assert st.lost == 0 and st.state is SubscriberState.LIVE


def test_a_gap_the_ring_no_longer_holds_marks_the_pod_gapped_until_cleared() -> None:
    with ZmqEventPublisher(buffer_steps=2) as pub:
        sink = Sink()
        with ZmqEventSubscriber("pod-a", pub.endpoint, sink, pub.replay_endpoint) as sub:
            connected(pub, sub, sink)
            lost_before = sub.status().lost
            pub.skip_live(4)
            for i in range(1, 6):
                pub.publish(stored(i))
            sink.wait_for(lambda got: 5 in sink.stored())
            assert sink.stored() == [4, 5]  # the ring held only the last two batches
            st = sub.status()
            assert st.lost - lost_before == 3 and st.state is SubscriberState.GAPPED
            pub.publish(KVEventBatch(ts=9.0, events=[AllBlocksCleared()]))
            sink.wait_for(lambda got: isinstance(got[-1][1].events[0], AllBlocksCleared))
            assert sub.status().state is SubscriberState.LIVE


def test_a_restarted_engine_clears_the_pod_and_its_new_stream_arrives() -> None:
    first = ZmqEventPublisher()
    ep, replay_ep = first.endpoint, first.replay_endpoint
    sink = Sink()
    with ZmqEventSubscriber("pod-a", ep, sink, replay_ep) as sub:
        connected(first, sub, sink)
        for i in range(1, 4):
            first.publish(stored(i))
        sink.wait_for(lambda got: 3 in sink.stored())
        first.close()
        # the restarted engine: same ports, sequence from 0, and its first batch says it holds nothing
        second = ZmqEventPublisher(ep, replay_ep)
        try:
            second.publish(KVEventBatch(ts=10.0, events=[AllBlocksCleared()]))
            second.publish(stored(7))
            deadline = time.monotonic() + 5
            while 7 not in sink.stored():
                assert time.monotonic() < deadline, "the restarted engine's events never arrived"
                second.publish(KVEventBatch(ts=11.0, events=[]))
                time.sleep(0.02)
            kinds = [type(e).__name__ for _, b in sink.got for e in b.events]
            after = kinds[kinds.index("AllBlocksCleared"):]
            assert "BlockStored" in after and sink.stored()[-1] == 7
            assert sub.status().resets == 1
        finally:
            second.close()


def test_garbage_on_the_socket_is_counted_and_skipped() -> None:
    ctx = zmq.Context.instance()
    raw = ctx.socket(zmq.PUB)
    raw.setsockopt(zmq.LINGER, 0)
    port = raw.bind_to_random_port("tcp://127.0.0.1")
    sink = Sink()
    try:
        with ZmqEventSubscriber("pod-g", f"tcp://127.0.0.1:{port}", sink, replay_on_join=False) as sub:
            deadline = time.monotonic() + 5
            seq = 0
            while not sink.got:  # wait until connected
                assert time.monotonic() < deadline
                raw.send_multipart([b"", seq.to_bytes(8, "big"), encode_batch(KVEventBatch(0.0, []))])
                seq += 1
                time.sleep(0.02)
            time.sleep(0.05)
            base = sub.status().batches
            raw.send_multipart([b"only one frame"])
            raw.send_multipart([b"", b"short", b"x"])
            raw.send_multipart([b"", (seq + 100).to_bytes(8, "big"), b"\xc1\xc1 not msgpack"])
            raw.send_multipart([b"", (seq + 101).to_bytes(8, "big"), b"\x93\x01\x02\x03"])
            raw.send(b"\x00" * 64)
            good = KVEventBatch(1.0, [BlockRemoved([42])])
            raw.send_multipart([b"", seq.to_bytes(8, "big"), encode_batch(good)])
            sink.wait_for(lambda got: any(isinstance(e, BlockRemoved) for _, b in got for e in b.events))
            st = sub.status()
            assert st.garbage == 5 and st.batches == base + 1 and st.state is SubscriberState.LIVE
    finally:
        raw.close(linger=0)


def test_a_callback_that_raises_is_counted_and_the_stream_goes_on(pub: ZmqEventPublisher) -> None:
    sink = Sink()

    def flaky(pod: str, batch: KVEventBatch) -> None:
        if any(isinstance(e, BlockStored) and e.block_hashes == [2] for e in batch.events):
            raise RuntimeError("index full")
        sink(pod, batch)

    with ZmqEventSubscriber("pod-a", pub.endpoint, flaky, pub.replay_endpoint) as sub:
        connected(pub, sub, sink)
        for i in (1, 2, 3):
            pub.publish(stored(i))
        sink.wait_for(lambda got: 3 in sink.stored())
        assert sink.stored() == [1, 3] and sub.status().callback_errors == 1


def test_status_is_silent_without_messages_and_stop_is_prompt() -> None:
    sub = ZmqEventSubscriber("pod-s", "tcp://127.0.0.1:9", lambda p, b: None, silent_after_s=0.05).start()
    assert sub.status().state in (SubscriberState.CONNECTING, SubscriberState.SILENT)
    time.sleep(0.1)
    assert sub.status().state is SubscriberState.SILENT and sub.status().silent_for_s >= 0.05
    t0 = time.monotonic()
    sub.stop()
    assert time.monotonic() - t0 < 1.0
    assert sub.status().state is SubscriberState.STOPPED


def test_a_bad_endpoint_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="pod-x: bad KV-event endpoint"):
        ZmqEventSubscriber("pod-x", "nonsense://", lambda p, b: None)
    with ZmqEventPublisher() as pub, pytest.raises(OSError, match="cannot bind"):
        ZmqEventPublisher(pub.endpoint)


def test_without_a_replay_socket_a_sequence_going_back_is_a_restart() -> None:
    ctx = zmq.Context.instance()
    raw = ctx.socket(zmq.PUB)
    raw.setsockopt(zmq.LINGER, 0)
    port = raw.bind_to_random_port("tcp://127.0.0.1")
    sink = Sink()

    def send(seq: int, batch: KVEventBatch) -> None:
        raw.send_multipart([b"", seq.to_bytes(8, "big"), encode_batch(batch)])

    try:
        with ZmqEventSubscriber("pod-r", f"tcp://127.0.0.1:{port}", sink, replay_on_join=False) as sub:
            seq = 0
            deadline = time.monotonic() + 5
            while not sink.got:
                assert time.monotonic() < deadline
                send(seq, KVEventBatch(0.0, []))
                seq += 1
                time.sleep(0.02)
            send(seq + 50, stored(1))  # a gap nobody can replay: lost, gapped
            sink.wait_for(lambda got: 1 in sink.stored())
            assert sub.status().state is SubscriberState.GAPPED
            send(0, stored(2))  # the sequence went back: a new engine, holding nothing
            sink.wait_for(lambda got: 2 in sink.stored())
            kinds = [type(e).__name__ for _, b in sink.got for e in b.events]
            assert kinds[-2:] == ["AllBlocksCleared", "BlockStored"]
            st = sub.status()
            assert st.resets == 1 and st.lost == 50 and st.state is SubscriberState.LIVE
    finally:
        raw.close(linger=0)


def test_a_batch_sent_before_the_subscription_landed_arrives_without_a_next_one(pub: ZmqEventPublisher) -> None:
    """ZMQ's slow joiner: the pod publishes once as the subscriber joins and then goes quiet. The
    subscriber asks the replay ring on connecting, so it does not wait for a next batch."""
    sink = Sink()
    sub = ZmqEventSubscriber("pod-a", pub.endpoint, sink, pub.replay_endpoint)
    pub.publish(stored(1))  # before the subscriber's socket even connects
    assert pub.flush()
    with sub:
        sink.wait_for(lambda got: sink.stored() == [1])
        st = sub.status()
        assert st.replayed == 1 and st.lost == 0 and st.state is SubscriberState.LIVE
        pub.publish(stored(2))  # the live stream goes on from there, nothing twice
        sink.wait_for(lambda got: 2 in sink.stored())
        assert sink.stored() == [1, 2] and sub.status().gaps == 0


def test_what_the_join_replayed_is_not_delivered_again_from_the_live_socket(pub: ZmqEventPublisher) -> None:
    sink = Sink()
    with ZmqEventSubscriber("pod-a", pub.endpoint, sink, pub.replay_endpoint) as sub:
        # publish steadily while the subscriber joins: some batches come by both the replay and the SUB socket
        for i in range(1, 301):
            pub.publish(stored(i))
            time.sleep(0.001)
        sink.wait_for(lambda got: 300 in sink.stored())
        assert sink.stored() == list(range(1, 301))
        st = sub.status()
        assert st.resets == 0 and st.lost == 0 and st.state is SubscriberState.LIVE
