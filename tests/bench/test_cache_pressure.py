"""The cache-pressure scenario really exceeds the pool's KV cache: every pod evicts."""

from __future__ import annotations

from bench import workloads as wl
from bench.scenarios import SCENARIOS
from ray_epp.simulator import ClusterSim, RoundRobin


def test_prefixes_are_two_to_four_times_the_pools_cache_and_pods_evict() -> None:
    scenario = SCENARIOS["cache-pressure"]
    pods = scenario.pods()
    ratio = wl.prefix_to_cache_ratio(wl.CACHE_PRESSURE, len(pods), pods[0].num_gpu_blocks, pods[0].block_size)
    assert 2 <= ratio <= 4
    workload = scenario.workload(40.0, 0, 400)
    assert len({r.prompt[:64] for r in workload}) > 150  # many distinct system prompts in a short run
    sim = ClusterSim(pods, RoundRobin())
    report = sim.run(workload)
    assert all(r.status == "ok" for r in report.results)
    assert all(e.kv.evictions > 0 for e in sim.engines)
