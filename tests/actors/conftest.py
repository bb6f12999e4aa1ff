"""Fixtures of the actor tests."""

from __future__ import annotations

import pytest

from ray_epp.simulator import PodConfig, start_sim_pods_in_thread
from tests.actors.support import BLOCKS


@pytest.fixture(scope="module")
def sim():
    configs = [PodConfig(name=n, num_gpu_blocks=b, max_loras=2 if n == "sim-0" else 4) for n, b in BLOCKS.items()]
    with start_sim_pods_in_thread(configs) as cluster:
        yield cluster
