"""A router whose deployment has no replicas left (deleted, scaled to zero) lets go of its mirror:
Serve keeps the router alive as long as its cached handle, and what it holds is walked by every
full garbage collection of the process. The real router, built as Serve builds it, deciding on its
mirror (no profile actors: none are needed to decide), on the replica stand-ins of
bench/llm_router_decision.py."""

from __future__ import annotations

import asyncio
import gc
import weakref

from ray.serve._private.common import RequestMetadata
from ray.serve.request_router import PendingRequest

from bench.llm_router_decision import replicas, router
from bench.serve_llm_replica import request_model
from bench.serve_llm_routing import Shape, workload


def test_a_router_left_without_replicas_drops_its_mirror():
    async def run():
        epp = router()
        reps = replicas(4)
        epp.update_replicas(reps)  # type: ignore[arg-type]
        for i, sim in enumerate(workload("shared-prefix", Shape(requests=20, groups=2), seed=0)):
            meta = RequestMetadata(request_id=f"q{i}", internal_request_id=f"q{i}", call_method="completions")
            pending = PendingRequest(args=[request_model(sim.body)], kwargs={}, metadata=meta)
            ranked = await epp.choose_replicas(reps, pending)  # type: ignore[arg-type]
            epp.on_request_routed(pending, ranked[0][0].replica_id, None)
        await asyncio.sleep(0)  # the routed hooks run on the loop
        assert epp.counters.scheduled == 20 and epp._routed
        old = weakref.ref(epp.mirror)
        epp.update_replicas([])  # the deployment was deleted
        await asyncio.sleep(0.05)  # its last sync (it has no actor: it fails quietly) and close
        return epp, old

    epp, old = asyncio.run(run())
    gc.collect()
    assert old() is None  # the old mirror, its prefix index and ledgers, are garbage
    assert not epp._attached and not epp._routed and not epp._decisions
    assert epp.counters.scheduled == 20  # the counters carry over
