"""NVIDIA Dynamo's KV router, its own code: the `SelectionService` of `ai-dynamo-runtime` (the
Rust selection core behind `python -m dynamo.frontend --router-mode kv`, in process, no etcd or
NATS), with its defaults, against the cluster simulation's pods.

* Its KV indexer learns from the pods' own KV events, as in Dynamo's default (`--kv-events`): each
  simulated pod gets a vLLM-protocol ZMQ publisher on 127.0.0.1 (ray_epp.kvevents), registered as
  the worker's `kv_events_endpoint`, and every batch the simulation delivers is published there.
* Per request `select_and_reserve` (the prompt's token ids): Dynamo's cost, lowest wins —
  `prefill_load_scale · max(active_prefill_blocks + prompt_blocks - overlap_credit, 0) +
  potential_decode_blocks`, overlap credit 1.0 a device block, 0.75 host, 0.25 disk, temperature 0
  (all its defaults; `temperature` may be set). Its active-sequence tracker books the request's
  prefill tokens and blocks on the chosen worker at once; `prefill_complete` at the first token
  moves them to decode; `free_reservation` at completion releases them.
* Virtual time against a wall-clock indexer: the indexer applies events on its own threads, so
  before each decision every pod that published since the last decision gets a marker block
  (unique token ids) after its events, and the decision waits until the indexer shows every
  marker (a worker's events are applied in order). The decision then sees exactly the events the
  simulation delivered before it, as a router with instant event delivery would; no decision
  depends on wall-clock timing.

Not modelled: Dynamo's router-side queue (`router_queue_threshold`, off by default in 1.6) and
the output blocks a decode adds (`router_track_output_blocks`, off by default). The service and
its records are bench/dynamo_core.py's (shared with the end-to-end forwarder); without
ai-dynamo-runtime the policy raises `DynamoUnavailable`."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

from bench.dynamo_core import BLOCK_SIZE, MODEL, U32, selection_request, selection_service, u32, worker_record
from ray_epp.kvevents.events import BlockRemoved, BlockStored, KVEventBatch
from ray_epp.kvevents.zmq_publisher import ZmqEventPublisher
from ray_epp.simulator import PodView, RequestResult, SimRequest
from ray_epp.simulator.tokens import token_ids

MARKER_BASE = 0x7FFF_0000  # token ids no simulated prompt uses (ASCII chunks are < 0x7F7F7F7F)
MARKER_HASH = 1 << 62  # the markers' engine hashes (the pods' are their own)
BARRIER_TIMEOUT_S = 10.0


class DynamoKvRouter:
    def __init__(self, seed: int = 0, temperature: float = 0.0) -> None:
        self.seed = seed
        self.temperature = temperature
        self.loop = asyncio.new_event_loop()
        self.service = selection_service()
        self.publishers: dict[str, ZmqEventPublisher] = {}
        self.worker_ids: dict[str, int] = {}
        self.names: dict[int, str] = {}
        self.dirty: set[str] = set()
        self.markers = itertools.count()
        self.reserved: set[str] = set()

    # -- the simulation's hooks -------------------------------------------------------------------

    def route(self, request: SimRequest, pods: list[PodView], now: float) -> str:
        for pod in pods:
            if pod.name not in self.worker_ids:
                self._register(pod.name)
        self._barrier(self.dirty)
        body = selection_request(request.request_id, token_ids(request.prompt))
        if self.temperature:
            body["router_config_override"] = {"router_temperature": self.temperature}
        chosen = self._run(self.service.select_and_reserve, body)
        self.reserved.add(request.request_id)
        return self.names[int(chosen["worker_id"])]

    def on_kv_events(self, pod: str, batch: KVEventBatch) -> None:
        if pod not in self.publishers:
            self._register(pod)
        self.publishers[pod].publish(_u32_batch(batch))
        self.dirty.add(pod)

    def on_first_token(self, request: SimRequest, pod: str, now: float) -> None:
        if request.request_id in self.reserved:
            self._run(self.service.prefill_complete, request.request_id)

    def on_complete(self, request: SimRequest, pod: str | None, result: RequestResult) -> None:
        if request.request_id in self.reserved:
            self.reserved.discard(request.request_id)
            self._run(self.service.free_reservation, request.request_id)

    def close(self) -> None:
        self.service.shutdown()
        for pub in self.publishers.values():
            pub.close()
        self.loop.close()

    # -- workers and the event barrier ------------------------------------------------------------

    def _register(self, name: str) -> None:
        worker_id = len(self.worker_ids) + 1
        pub = ZmqEventPublisher(endpoint="tcp://127.0.0.1:0", replay_endpoint="tcp://127.0.0.1:0")
        self.publishers[name], self.worker_ids[name], self.names[worker_id] = pub, worker_id, name
        # the endpoint is never called: the simulation serves the request
        record = worker_record(worker_id, f"http://127.0.0.1:9/{name}", pub.endpoint, pub.replay_endpoint)
        self._run(self.service.upsert_worker, record)
        self._barrier({name}, republish=True)  # the subscription is live (ZMQ drops what precedes it)

    def _barrier(self, pods: set[str], republish: bool = False) -> None:
        """Until the indexer has applied everything published to `pods`: a marker block after their
        events, seen on every one of them, then removed."""
        if not pods:
            return
        n = next(self.markers)
        tokens = [MARKER_BASE + (n * BLOCK_SIZE + i) % 0xFFFF for i in range(BLOCK_SIZE)]
        stored = KVEventBatch(time.time(), [BlockStored([MARKER_HASH + n], None, tokens, BLOCK_SIZE)])
        waiting = {self.worker_ids[p]: p for p in pods}
        for name in waiting.values():
            self.publishers[name].publish(stored)
        deadline = time.monotonic() + BARRIER_TIMEOUT_S
        while waiting:
            scores = self._run(self.service.overlap_scores, {"model_name": MODEL, "token_ids": tokens})
            for w in scores["workers"]:
                if w["device_blocks"] >= 1:
                    waiting.pop(int(w["worker_id"]), None)
            if not waiting:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"Dynamo's indexer did not apply the events of {sorted(waiting.values())}")
            if republish:
                for name in waiting.values():
                    self.publishers[name].publish(stored)
            time.sleep(0.0005 if not republish else 0.01)
        removed = KVEventBatch(time.time(), [BlockRemoved([MARKER_HASH + n])])
        for name in pods:
            self.publishers[name].publish(removed)
        self.dirty -= pods

    def _run(self, method: Any, arg: Any) -> Any:
        """One of the service's async methods, to completion (its futures need a running loop)."""

        async def call() -> Any:
            return await method(arg)

        return self.loop.run_until_complete(call())


def _u32_batch(batch: KVEventBatch) -> KVEventBatch:
    events = [
        BlockStored(e.block_hashes, e.parent_block_hash, u32(e.token_ids), e.block_size, e.lora_id, e.medium)
        if isinstance(e, BlockStored) and any(t > U32 for t in e.token_ids)
        else e
        for e in batch.events
    ]
    return KVEventBatch(batch.ts, events, batch.data_parallel_rank)
