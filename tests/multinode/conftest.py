"""The multi-node modules' one `ray.cluster_utils.Cluster`, started once for them all (a head and
three workers cost about a minute to start here): a head that runs no actor (0 CPUs: Serve's
controller and proxy, this driver) and three workers with labels. test_cluster.py uses it whole;
test_node_loss.py removes workers, so it runs after (the modules run in name order)."""

from __future__ import annotations

import pytest

from tests.multinode.nodes import start_cluster

WORKERS = {
    "w1": {"epp/host": "w1", "epp/profiles": "yes"},
    "w2": {"epp/host": "w2", "gpu": "l4"},
    "w3": {"epp/host": "w3"},
}


@pytest.fixture(scope="package")
def cluster():
    """(cluster, node id by name, node by name) for head, w1, w2, w3."""
    yield from start_cluster(WORKERS, head_cpus=0, worker_cpus=2)
