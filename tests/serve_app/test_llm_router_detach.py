"""The real router in process, built as Serve builds it, deciding on its mirror (no profile actors:
none are needed to decide), on the replica stand-ins of bench/llm_router_decision.py: a router
whose deployment has no replicas left (deleted, scaled to zero) lets go of its mirror (Serve keeps
the router alive as long as its cached handle, and what it holds is walked by every full garbage
collection of the process); `trace_decisions` keeps the last decisions' scores."""

from __future__ import annotations

import asyncio
import gc
import weakref

from ray.serve._private.common import RequestMetadata
from ray.serve.request_router import PendingRequest

from bench.llm_router_decision import replicas, router
from bench.serve_llm_replica import request_model
from bench.serve_llm_workloads import Shape, workload


async def decide(epp, reps, n: int = 20) -> list[str]:
    """`n` shared-prefix decisions, each reported routed to its first target; their replicas."""
    out = []
    for i, sim in enumerate(workload("shared-prefix", Shape(requests=n, groups=2), seed=0)):
        meta = RequestMetadata(request_id=f"q{i}", internal_request_id=f"q{i}", call_method="completions")
        pending = PendingRequest(args=[request_model(sim.body)], kwargs={}, metadata=meta)
        ranked = await epp.choose_replicas(reps, pending)
        epp.on_request_routed(pending, ranked[0][0].replica_id, None)
        out.append(ranked[0][0].replica_id.unique_id)
    await asyncio.sleep(0)  # the routed hooks run on the loop
    return out


def test_a_router_left_without_replicas_drops_its_mirror():
    async def run():
        epp = router()
        reps = replicas(4)
        epp.update_replicas(reps)  # type: ignore[arg-type]
        await decide(epp, reps)
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


def test_decision_traces_hold_each_scorers_scores_of_the_last_decisions():
    async def run():
        epp = router()
        epp._trace_decisions = 5  # as `initialize_state(trace_decisions=5)` sets it
        reps = replicas(4)
        epp.update_replicas(reps)  # type: ignore[arg-type]
        return epp, await decide(epp, reps)

    epp, chosen = asyncio.run(run())
    assert list(epp.decision_traces) == [f"q{i}" for i in range(15, 20)]  # the last five, by request id
    last = epp.decision_traces["q19"]["profiles"]["default"]
    assert last["picked"] == [chosen[-1]]
    scorers = {s["plugin"]: s["scores"] for s in last["scorers"]}
    names = {r.replica_id.unique_id for r in replicas(4)}
    filtered = [f["plugin"] for f in last["filters"]]
    assert filtered and set(last["filters"][0]["kept"]) | set(last["filters"][0]["removed"]) == names
    # the scorers score what the filters kept (the default's sticky filter keeps the prefix's home)
    assert "prefix-cache-scorer" in scorers and set(scorers["prefix-cache-scorer"]) == set(last["filters"][-1]["kept"])
    assert not router().decision_traces  # off by default
