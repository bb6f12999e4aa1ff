"""EPPRequestRouter's replica -> endpoint conversion (serve_app/llm_router/endpoints.py), kept per
replica info: what changes in a replica's info reaches the scheduler, and what does not change is
not read again. The real router (built as Serve builds it, deciding on its local mirror, no actors)
over stand-ins of Serve's RunningReplica (bench/llm_router_decision.py)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

from ray.serve._private.common import RequestMetadata
from ray.serve._private.request_router.common import PendingRequest

from bench.llm_router_decision import StandInReplica, replicas, router
from serve_app.llm_router.stats import engine_routing_stats


def test_an_unchanged_replica_info_is_converted_once_and_every_change_is_seen():
    async def run() -> None:
        epp = router()
        reps = replicas(3)
        epp.update_replicas(reps)  # type: ignore[arg-type]
        first = epp.endpoint_of(reps[0])  # type: ignore[arg-type]
        assert epp.endpoint_of(reps[0]) is first  # type: ignore[arg-type]
        assert first.labels["ray.io/serve-replica-id"] == "r00" and first.metrics.running_requests_size == 4

        cases = [  # (what Serve replaced in the replica's info, what the endpoint must show)
            ("routing_stats", engine_routing_stats(waiting=50, kv_cache_usage=0.97),
             lambda ep: ep.metrics.waiting_queue_size == 50 and ep.metrics.kv_cache_usage_percent == 0.97),
            ("multiplexed_model_ids", {"lora-a"}, lambda ep: "lora-a" in ep.metrics.active_models),
            ("node_id", "node-7", lambda ep: ep.labels["ray.io/node-id"] == "node-7"),
            ("replica_metadata", {"tier": "gold"}, lambda ep: ep.labels["tier"] == "gold"),
        ]  # fmt: skip
        before = first
        for attr, value, shows in cases:
            setattr(reps[0], attr, value)
            now = epp.endpoint_of(reps[0])  # type: ignore[arg-type]
            assert now is not before and shows(now), attr
            assert epp.endpoint_of(reps[0]) is now, attr
            before = now

        silent = replace(reps[1], routing_stats={})  # publishes nothing: Serve's queue length, per request
        epp.update_replicas([reps[0], silent])  # type: ignore[list-item]
        assert set(epp._endpoints) == {reps[0].replica_id}  # the replicas gone are forgotten
        epp.replica_queue_len_cache.update(silent.replica_id, 3)
        assert epp.endpoint_of(silent).metrics.waiting_queue_size == 3  # type: ignore[arg-type]
        epp.replica_queue_len_cache.update(silent.replica_id, 9)
        assert epp.endpoint_of(silent).metrics.waiting_queue_size == 9  # type: ignore[arg-type]

    asyncio.run(run())


def test_a_replica_that_becomes_overloaded_is_avoided_on_the_next_decision():
    async def run() -> None:
        epp = router()
        reps: list[StandInReplica] = replicas(2)
        epp.update_replicas(reps)  # type: ignore[arg-type]
        body = {"model": "m", "prompt": "hello " * 40, "max_tokens": 4}

        async def first_choice(i: int) -> str:
            meta = RequestMetadata(request_id=f"q{i}", internal_request_id=f"q{i}")
            ranked = await epp.choose_replicas(reps, PendingRequest(args=[body], kwargs={}, metadata=meta))  # type: ignore[arg-type]
            return ranked[0][0].replica_id.unique_id

        for busy, idle in ((0, 1), (1, 0)):
            reps[busy].routing_stats = engine_routing_stats(waiting=50, running=8, kv_cache_usage=0.97)
            reps[idle].routing_stats = engine_routing_stats(waiting=0, running=0, kv_cache_usage=0.0)
            assert await first_choice(busy) == reps[idle].replica_id.unique_id

    asyncio.run(run())


def test_a_decision_is_in_the_ledger_before_serve_reports_it_and_leaves_it_at_its_inferred_first_token():
    async def run() -> None:
        epp = router()
        reps: list[StandInReplica] = replicas(2)
        for r in reps:
            r.routing_stats = engine_routing_stats(waiting=0, running=0, block_size=16, num_blocks=1024)
        epp.update_replicas(reps)  # type: ignore[arg-type]
        backlog = next(p for p in epp.mirror.followers["default"].profile.plugins()
                       if p.type_name == "prefill-eta-scorer").backlog  # fmt: skip
        meta = RequestMetadata(request_id="q0", internal_request_id="q0")
        pending = PendingRequest(args=[{"model": "m", "prompt": "hello " * 400}], kwargs={}, metadata=meta)
        ranked = await epp.choose_replicas(reps, pending)  # type: ignore[arg-type]
        chosen = ranked[0][0]
        assert set(backlog()) == {chosen.replica_id.unique_id}  # learned at the decision
        tokens = backlog()[chosen.replica_id.unique_id]
        epp.on_request_routed(pending, chosen.replica_id, None)  # Serve's report, a round trip later
        assert backlog() == {chosen.replica_id.unique_id: tokens}  # not counted twice
        # The replica's next published state: its engine queue is empty, so the request was admitted.
        await asyncio.sleep(0.02)
        chosen.routing_stats = engine_routing_stats(waiting=1, running=0, block_size=16, num_blocks=1024)
        epp.update_replicas(reps)  # type: ignore[arg-type]
        assert backlog() == {chosen.replica_id.unique_id: tokens}  # one waiting: it may be this one
        await asyncio.sleep(0.001)
        chosen.routing_stats = engine_routing_stats(waiting=0, running=1, block_size=16, num_blocks=1024)
        epp.update_replicas(reps)  # type: ignore[arg-type]
        assert backlog() == {} and epp.counters.first_tokens_inferred == 1

    asyncio.run(run())
