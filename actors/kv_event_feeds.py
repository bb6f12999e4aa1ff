"""The KV-event subscriptions of one profile actor: one `kvevents.ZmqEventSubscriber` per pod of
its snapshot, started when a pod appears, restarted when its event address changes, stopped when
it leaves; their batches reach the actor's `KVEventSink` plugins in order, in batches, on the
actor's event loop.

A subscriber's thread only appends to a deque; `drain()` (every `interval_s`, on the actor's loop,
so plugin state is only ever touched there) hands each pod's pending batches to every sink in one
call and tells the sinks when a pod's stream state changes (`live`, `gapped`, `silent`,
`connecting`; `gone` when it left). Each profile actor (and shard) subscribes for itself: a ZMQ
PUB socket fans out to every subscriber, and the actors that own prefix state see the events with
no extra hop.

Where a pod publishes: its `kvEvents.endpoint` (and `replay`) from the pods file (labels
`KV_EVENTS_LABEL` / `KV_REPLAY_LABEL` on the endpoint), else `tcp://<address>:<port>` with the
sink's `kv_event_port()` (llm-d's `socketPort`, vLLM's default 5557), without replay."""

from __future__ import annotations

import logging
from collections import deque
from typing import Any

from actors.options import KV_EVENTS_LABEL, KV_REPLAY_LABEL
from ray_epp.kvevents import KVEventBatch, ZmqEventSubscriber
from scheduler import Endpoint
from scheduler.interfaces import KVEventSink

log = logging.getLogger("ray_epp.actors.kv_events")

GONE = "gone"


def event_addresses(endpoint: Endpoint, default_port: int) -> tuple[str, str | None]:
    """(PUB endpoint, replay endpoint or None) of a pod."""
    pub = endpoint.labels.get(KV_EVENTS_LABEL)
    if pub:
        return pub, endpoint.labels.get(KV_REPLAY_LABEL) or None
    host = f"[{endpoint.address}]" if ":" in endpoint.address else endpoint.address
    return f"tcp://{host}:{default_port}", None


class KVEventFeeds:
    """sync(endpoints) follows the pool; drain() delivers; statuses() for info(); close()."""

    def __init__(self, sinks: list[KVEventSink], *, silent_after_s: float = 10.0) -> None:
        self.sinks = sinks
        self.port = sinks[0].kv_event_port() if sinks else 0
        self.silent_after_s = silent_after_s
        self._subs: dict[str, tuple[tuple[str, str | None], ZmqEventSubscriber]] = {}
        self._pending: deque[tuple[str, KVEventBatch]] = deque()
        self._states: dict[str, str] = {}
        self.errors = 0
        self.delivered = 0

    def _on_batch(self, pod: str, batch: KVEventBatch) -> None:  # the subscriber's thread
        self._pending.append((pod, batch))

    def sync(self, endpoints: list[Endpoint]) -> None:
        wanted = {ep.name: event_addresses(ep, self.port) for ep in endpoints}
        for pod in [p for p, (addrs, _) in self._subs.items() if wanted.get(p) != addrs]:
            self._stop(pod, gone=pod not in wanted)
        for pod, addrs in wanted.items():
            if pod not in self._subs:
                try:
                    sub = ZmqEventSubscriber(
                        pod, addrs[0], self._on_batch, addrs[1], silent_after_s=self.silent_after_s
                    ).start()
                except ValueError as e:  # a bad address: counted and shown, the pod scored approximately
                    self.errors += 1
                    log.warning("%s", e)
                    continue
                self._subs[pod] = (addrs, sub)

    def _stop(self, pod: str, *, gone: bool) -> None:
        _, sub = self._subs.pop(pod)
        sub.stop()
        self.drain()  # what it delivered before it stopped
        self._states.pop(pod, None)
        if gone:
            self._tell_status(pod, GONE)

    def drain(self) -> int:
        """Deliver pending batches (per pod, in order) and state changes; returns batches delivered."""
        pending = self._pending
        by_pod: dict[str, list[KVEventBatch]] = {}
        n = 0
        while pending:
            pod, batch = pending.popleft()
            by_pod.setdefault(pod, []).append(batch)
            n += 1
        for pod, batches in by_pod.items():
            for sink in self.sinks:
                try:
                    sink.apply_kv_events(pod, batches)
                except Exception:  # a sink's bug must not stop the others or the feed
                    self.errors += 1
                    log.exception("KV-event sink %s failed on %s's events", sink.name, pod)
        self.delivered += n
        for pod, (_, sub) in self._subs.items():
            state = str(sub.status().state)
            if self._states.get(pod) != state:
                self._states[pod] = state
                self._tell_status(pod, state)
        return n

    def _tell_status(self, pod: str, state: str) -> None:
        for sink in self.sinks:
            try:
                sink.set_kv_event_status(pod, state)
            except Exception:
                self.errors += 1
                log.exception("KV-event sink %s failed on %s's status", sink.name, pod)

    def statuses(self) -> dict[str, dict[str, Any]]:
        """Per pod: its stream's state and counters (`kvevents.SubscriberStatus`) and addresses."""
        out: dict[str, dict[str, Any]] = {}
        for pod, (addrs, sub) in self._subs.items():
            st = sub.status()
            out[pod] = {
                "state": str(st.state),
                "endpoint": addrs[0],
                "replay": addrs[1],
                "batches": st.batches,
                "replayed": st.replayed,
                "gaps": st.gaps,
                "lost": st.lost,
                "resets": st.resets,
                "garbage": st.garbage,
            }
        return out

    def metric_samples(self, profile: str) -> dict[tuple[str, tuple[str, ...]], float]:
        """This actor's subscriptions as metric samples (actors/metric_families/): per pod its
        state, gaps and lost batches (Ray EPP's), batches received (llm-d's messages), and the
        subscribers running and batches not yet delivered (llm-d's)."""
        out: dict[tuple[str, tuple[str, ...]], float] = {
            ("llm_d_epp_kv_cache_events_active_subscribers", ()): float(len(self._subs)),
            ("llm_d_epp_kv_cache_events_pool_queue_depth", ()): float(len(self._pending)),
        }
        for pod, (_, sub) in self._subs.items():
            st = sub.status()
            out[("ray_epp_kv_events_subscriber_state", (profile, pod, str(st.state)))] = 1.0
            out[("ray_epp_kv_events_gaps_total", (profile, pod))] = float(st.gaps)
            out[("ray_epp_kv_events_lost_total", (profile, pod))] = float(st.lost)
            out[("llm_d_epp_kv_cache_events_messages_received_total", (pod,))] = float(st.batches)
        return out

    def close(self) -> None:
        for pod in list(self._subs):
            self._stop(pod, gone=False)
