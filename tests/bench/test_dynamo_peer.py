"""Dynamo's KV router as a peer: its own selection core (ai-dynamo-runtime, an optional install),
fed the simulated pods' KV events over vLLM's ZMQ protocol on 127.0.0.1."""

from __future__ import annotations

import time

import pytest

from bench.drivers import ClusterSimDriver
from bench.workloads import SharedPrefixSpec, shared_prefix_workload
from ray_epp.kvevents.events import BlockStored, KVEventBatch
from ray_epp.simulator import RequestResult, make_pod_configs
from ray_epp.simulator.tokens import token_ids

from .helpers import SYSTEM, pods, req

pytest.importorskip("dynamo._core", reason="pip install --no-deps ai-dynamo-runtime==1.6.1")

from bench.policies.dynamo import BLOCK_SIZE, DynamoKvRouter


def stored(prompt: str, first_hash: int) -> KVEventBatch:
    """The batch a pod publishes after computing `prompt`'s full blocks."""
    ids = token_ids(prompt)
    full = len(ids) // BLOCK_SIZE * BLOCK_SIZE
    hashes = [first_hash + i for i in range(full // BLOCK_SIZE)]
    return KVEventBatch(time.time(), [BlockStored(hashes, None, ids[:full], BLOCK_SIZE)])


@pytest.mark.parametrize("holder", ["a", "b"])
def test_a_prompt_goes_where_the_events_say_its_prefix_is(holder):
    router = DynamoKvRouter()
    try:
        pool = pods("a", "b")
        for name in ("a", "b"):  # registered before any event, as the simulation's first request does
            router._register(name)
        router.on_kv_events(holder, stored(SYSTEM + "question zero", 1000))  # delivered just before the decision
        first = req("r1", SYSTEM + "question one")
        assert router.route(first, pool, 0.0) == holder
        router.on_first_token(first, holder, 0.01)
        done = RequestResult(request_id="r1", model="m", status="ok", arrival=0.0, pod=holder)
        router.on_complete(first, holder, done)
        assert router.reserved == set()
    finally:
        router.close()


def test_in_the_cluster_simulation_shared_prefixes_hit():
    spec = SharedPrefixSpec(groups=4, prompts_per_group=8, system_tokens=512, question_tokens=32, output_tokens=16)
    workload = shared_prefix_workload(spec, rate=20.0, seed=0, num_requests=32)
    run = ClusterSimDriver().run("dynamo-kv", make_pod_configs(2), workload, seed=0)
    assert run.metrics["completed"] == 32
    assert run.metrics["prefix_hit_rate"] > 0.5  # each group's prefix is computed about once
